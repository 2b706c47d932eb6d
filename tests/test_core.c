// Core utilities: the counter-based RNG (known-answer vectors of Random123's
// Philox4x32-10) and the error reporting helpers.
#include "core/check.h"
#include "core/rng.h"
#include "test.h"

static void test_philox_known_answers(void) {
    Philox4x32 zero = philox4x32(0, 0, 0);
    uint32_t expect_zero[4] = {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u};
    for (int i = 0; i < 4; i++) EXPECT(zero.v[i] == expect_zero[i], "word %d = %08x", i, zero.v[i]);
    Philox4x32 ones = philox4x32(~0ULL, ~0ULL, ~0ULL);
    uint32_t expect_ones[4] = {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu};
    for (int i = 0; i < 4; i++) EXPECT(ones.v[i] == expect_ones[i], "word %d = %08x", i, ones.v[i]);
}

static void test_uniform_statistics(void) {
    // Mean and variance of 200k draws: 1/2 and 1/12 within 5 standard errors.
    const int n = 200000;
    double sum = 0, sum_sq = 0;
    for (int i = 0; i < n; i++) {
        float u = rng_uniform(1234, 7, (uint64_t)i);
        EXPECT(u >= 0.0f && u < 1.0f, "uniform out of range: %g", u);
        sum += u;
        sum_sq += (double)u * u;
    }
    double mean = sum / n, var = sum_sq / n - mean * mean;
    EXPECT_CLOSE(mean, 0.5, 5 * sqrt(1.0 / 12 / n), 0, "mean of uniforms");
    EXPECT_CLOSE(var, 1.0 / 12, 5 * sqrt(1.0 / 180 / n), 0, "variance of uniforms");
    int counts[5] = {0};
    for (int i = 0; i < 50000; i++) counts[rng_below(99, 3, (uint64_t)i, 5)]++;
    for (int k = 0; k < 5; k++) EXPECT(abs(counts[k] - 10000) < 500, "bucket %d has %d", k, counts[k]);
}

static void test_streams_differ(void) {
    EXPECT(rng_stream("sample", 0, 1) != rng_stream("sample", 1, 0), "streams collide");
    EXPECT(rng_stream("sample", 0, 0) != rng_stream("dropout", 0, 0), "streams collide");
    EXPECT(rng_uniform(1, 2, 3) == rng_uniform(1, 2, 3), "not a pure function");
}

static void test_error_messages_are_one_line(void) {
    EXPECT(err_set("bad %s\nsecond line", "thing") == -1, "err_set returns -1");
    EXPECT(strcmp(err_msg(), "bad thing second line") == 0, "got '%s'", err_msg());
    err_clear();
    EXPECT(err_msg()[0] == '\0', "err_clear");
}

int main(void) {
    RUN(test_philox_known_answers);
    RUN(test_uniform_statistics);
    RUN(test_streams_differ);
    RUN(test_error_messages_are_one_line);
    TEST_EXIT();
}
