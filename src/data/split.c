// DeepSpeed-Chat's data splits; see split.h for the exact procedure.
#include "data/split.h"

#include <ctype.h>
#include <math.h>
#include <string.h>

#include "core/check.h"
#include "data/mt19937.h"

// The weights of `split_spec`, as Python's float() reads each comma-separated entry
// (surrounding whitespace allowed). *weights is xmalloc'd.
static int parse_split_weights(const char *split_spec, double **weights, int *count) {
    if (!split_spec || !*split_spec) return err_set("empty split (--data-split)");
    int parts = 1;
    for (const char *c = split_spec; *c; c++) parts += *c == ',';
    double *values = xcalloc((size_t)parts, sizeof *values);
    const char *entry = split_spec;
    for (int k = 0; k < parts; k++) {
        const char *end = strchr(entry, ',');
        if (!end) end = entry + strlen(entry);
        const char *first = entry, *last = end;
        while (first < last && isspace((unsigned char)*first)) first++;
        while (last > first && isspace((unsigned char)last[-1])) last--;
        size_t length = (size_t)(last - first);
        // Plain decimal numbers only: strtod would also take hex floats, "inf", "nan".
        bool plain = length > 0 && length < 64;
        for (size_t i = 0; plain && i < length; i++)
            plain = isdigit((unsigned char)first[i]) || strchr(".eE+-", first[i]);
        char number[64];
        char *parsed_end = number;
        if (plain) {
            memcpy(number, first, length);
            number[length] = '\0';
            values[k] = strtod(number, &parsed_end);
        }
        if (!plain || parsed_end != number + length || !isfinite(values[k])) {
            free(values);
            return err_set("split entry %d of \"%s\" is not a number (--data-split)", k + 1, split_spec);
        }
        if (values[k] < 0) {
            free(values);
            return err_set("split entry %d of \"%s\" is negative (--data-split)", k + 1, split_spec);
        }
        entry = end + 1;
    }
    *weights = values;
    *count = parts;
    return 0;
}

int data_split_boundaries(long n, const char *split_spec, long **boundaries, int *parts) {
    if (n < 0) return err_set("a dataset of %ld rows (--data-split)", n);
    double *weights = NULL;
    int count = 0;
    if (parse_split_weights(split_spec, &weights, &count) != 0) return -1;
    double sum = 0; // Python's sum(): left to right from 0
    for (int k = 0; k < count; k++) sum += weights[k];
    if (!(sum > 0)) {
        free(weights);
        return err_set("the split \"%s\" sums to zero (--data-split)", split_spec);
    }
    long *bounds = xmalloc((size_t)(count + 1) * sizeof *bounds);
    bounds[0] = 0;
    for (int k = 0; k < count; k++) {
        double fraction = weights[k] / sum;
        // nearbyint in the default rounding mode is round-half-even, as Python's round().
        bounds[k + 1] = bounds[k] + (long)nearbyint(fraction * (double)n);
    }
    long error = bounds[count] - n;
    for (int k = 1; k <= count; k++) bounds[k] -= error;
    free(weights);
    *boundaries = bounds;
    *parts = count;
    return 0;
}

int data_shuffle_permutation(long n, uint64_t seed, long **permutation) {
    if (n < 0) return err_set("a dataset of %ld rows (--data-split)", n);
    if (seed > 0xffffffffu)
        return err_set("seed %llu is outside numpy's RandomState range [0, 2^32) (--seed)",
                       (unsigned long long)seed);
    long *items = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *items);
    for (long i = 0; i < n; i++) items[i] = i;
    Mt19937 mt;
    mt19937_seed(&mt, (uint32_t)seed);
    mt19937_shuffle(&mt, items, n);
    *permutation = items;
    return 0;
}

// Python's slice bound: negative counts from the end, then clamped to [0, n].
static long python_slice_bound(long bound, long n) {
    if (bound < 0) bound += n;
    if (bound < 0) bound = 0;
    if (bound > n) bound = n;
    return bound;
}

int data_split_indices(long n, const char *split_spec, int phase, uint64_t seed, long **indices, long *count) {
    long *bounds = NULL;
    int parts = 0;
    if (data_split_boundaries(n, split_spec, &bounds, &parts) != 0) return -1;
    if (phase < 1 || phase > parts) {
        free(bounds);
        return err_set("phase %d, but the split \"%s\" has %d part%s (--data-split)", phase, split_spec, parts,
                       parts == 1 ? "" : "s");
    }
    long *permutation = NULL;
    if (data_shuffle_permutation(n, seed, &permutation) != 0) {
        free(bounds);
        return -1;
    }
    long start = python_slice_bound(bounds[phase - 1], n), stop = python_slice_bound(bounds[phase], n);
    long taken = stop > start ? stop - start : 0;
    long *selected = xmalloc((size_t)(taken > 0 ? taken : 1) * sizeof *selected);
    if (taken > 0) memcpy(selected, permutation + start, (size_t)taken * sizeof *selected);
    free(permutation);
    free(bounds);
    *indices = selected;
    *count = taken;
    return 0;
}

int data_split_indices_nested(long n, const char *outer_spec, int outer_part, const char *split_spec, int phase,
                              uint64_t seed, long **indices, long *count) {
    long *outer = NULL, outer_count = 0, *inner = NULL, inner_count = 0;
    if (data_split_indices(n, outer_spec, outer_part, seed, &outer, &outer_count) != 0) return -1;
    if (data_split_indices(outer_count, split_spec, phase, seed, &inner, &inner_count) != 0) {
        free(outer);
        return -1;
    }
    for (long i = 0; i < inner_count; i++) inner[i] = outer[inner[i]];
    free(outer);
    *indices = inner;
    *count = inner_count;
    return 0;
}
