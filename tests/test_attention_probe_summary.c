// bench/attention_probe_summary.h's arithmetic on made-up records, worked out by hand: the
// probes themselves run only on a GPU (bench/ops_breakdown in tests/gpu/run.sh), so this
// is what CI can check of what they print.
#include "../bench/attention_probe_summary.h"
#include "test.h"

static OpsAttentionProbeRecord warp(long long start, long long end, long long cycles, long long waiting, int sm,
                                    int steps) {
    return (OpsAttentionProbeRecord){start, end, cycles, waiting, sm, steps};
}

// Three blocks on two SMs and one that returned before its loop (zeros):
//   SM 0: block A [0, 1000] ns (one warp [10, 990]), block B [500, 1500]
//   SM 1: block C [0, 800]
// every warp 1000 cycles, 250 of them waiting, 5 steps.
static void test_summary_of_three_blocks(void) {
    OpsAttentionProbeRecord records[16] = {0};
    for (int i = 0; i < 4; i++) {
        records[i] = i == 1 ? warp(10, 990, 1000, 250, 0, 5) : warp(0, 1000, 1000, 250, 0, 5);
        records[4 + i] = warp(500, 1500, 1000, 250, 0, 5);
        // records[8 .. 11]: the block that returned early
        records[12 + i] = warp(0, 800, 1000, 250, 1, 5);
    }
    const AttentionProbeSummary s = summarize_attention_probe(records, 16);
    EXPECT(s.blocks == 3, "%ld blocks", s.blocks);
    EXPECT(s.sms == 2, "%d SMs", s.sms);
    EXPECT(s.resident_blocks_max == 2, "at most %d blocks on an SM", s.resident_blocks_max);
    EXPECT_CLOSE(s.span_us, 1.5, 1e-12, 0, "span");
    EXPECT_CLOSE(s.block_us_mean, (1.0 + 1.0 + 0.8) / 3, 1e-12, 0, "a block's mean time");
    EXPECT_CLOSE(s.block_us_max, 1.0, 1e-12, 0, "the longest block");
    EXPECT_CLOSE(s.steps_per_block_mean, 5, 1e-12, 0, "steps a block");
    EXPECT_CLOSE(s.cycles_per_step, 200, 1e-12, 0, "cycles a step");
    EXPECT_CLOSE(s.waiting_share, 0.25, 1e-12, 0, "waiting share");
    // 12 warps' cycles over their time: 3980 + 4000 + 3200 ns.
    EXPECT_CLOSE(s.clock_ghz, 12000.0 / 11180.0, 1e-12, 0, "clock");
    // Block-time over span x SMs: 2800 / 3000; SM 0 busy 1500 of 1500, SM 1 800; SM 1 idle
    // for the last 700.
    EXPECT_CLOSE(s.resident_blocks_mean, 2800.0 / 3000.0, 1e-12, 0, "blocks on an SM on average");
    EXPECT_CLOSE(s.sm_busy_share, 2300.0 / 3000.0, 1e-12, 0, "busy share");
    EXPECT_CLOSE(s.idle_at_end_share, 700.0 / 3000.0, 1e-12, 0, "idle at the end");
}

// Blocks one after another on one SM never count as resident together, and a gap between
// them is not busy time.
static void test_summary_of_blocks_in_turn(void) {
    OpsAttentionProbeRecord records[8];
    for (int i = 0; i < 4; i++) {
        records[i] = warp(0, 100, 50, 0, 7, 1);
        records[4 + i] = warp(300, 400, 50, 10, 7, 3);
    }
    const AttentionProbeSummary s = summarize_attention_probe(records, 8);
    EXPECT(s.blocks == 2 && s.sms == 1, "%ld blocks on %d SMs", s.blocks, s.sms);
    EXPECT(s.resident_blocks_max == 1, "at most %d blocks at once", s.resident_blocks_max);
    EXPECT_CLOSE(s.sm_busy_share, 200.0 / 400.0, 1e-12, 0, "busy share");
    EXPECT_CLOSE(s.idle_at_end_share, 0, 1e-12, 0, "idle at the end");
    EXPECT_CLOSE(s.steps_per_block_mean, 2, 1e-12, 0, "steps a block");
    EXPECT_CLOSE(s.cycles_per_step, 400.0 / 16, 1e-12, 0, "cycles a step");
    EXPECT_CLOSE(s.waiting_share, 40.0 / 400, 1e-12, 0, "waiting share");
}

// No block ran its loop: zeros, not a division by zero.
static void test_summary_of_nothing(void) {
    OpsAttentionProbeRecord records[4] = {0};
    const AttentionProbeSummary s = summarize_attention_probe(records, 4);
    EXPECT(s.blocks == 0 && s.sms == 0 && s.span_us == 0 && s.cycles_per_step == 0, "an empty summary");
}

int main(void) {
    RUN(test_summary_of_three_blocks);
    RUN(test_summary_of_blocks_in_turn);
    RUN(test_summary_of_nothing);
    TEST_EXIT();
}
