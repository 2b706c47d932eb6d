// What one probed launch of an mma attention kernel says (ops_cuda_attention_probe_begin /
// _end, ops.h): bench/ops_breakdown prints it as one JSON line. From the records of every
// warp (when its block started and ended, its SM, its loop's steps, its cycles and the
// cycles it waited for copies and barriers):
//   blocks, sms             blocks that ran their loop, and the SMs they ran on
//   span_us                 first block's start to last block's end
//   block_us_mean, _max     a block's time, start to end
//   steps_per_block_mean    steps of the loop a block took (tiles walked)
//   cycles_per_step         a warp's cycles over its steps: the loop's cost with the SM shared
//   waiting_share           the share of those cycles spent waiting for tiles and barriers
//   clock_ghz               cycles over time: the SM clock the launch ran at
//   resident_blocks_max     the most blocks on one SM at once
//   resident_blocks_mean    blocks on an SM, averaged over the span and the SMs
//   sm_busy_share           the share of the span an SM had a block, averaged over SMs
//   idle_at_end_share       the share of the span an SM stood idle after its last block
//                           (the launch's tail), averaged over SMs
// tests/test_attention_probe_summary.c checks the arithmetic on made-up records.
#pragma once
#include <stdio.h>
#include <stdlib.h>

#include "core/check.h"
#include "ops/ops.h"

enum { PROBE_WARPS_PER_BLOCK = 4, PROBE_MOST_SMS = 1024 };

typedef struct {
    long blocks;
    int sms, resident_blocks_max;
    double span_us, block_us_mean, block_us_max, steps_per_block_mean, cycles_per_step, waiting_share, clock_ghz;
    double resident_blocks_mean, sm_busy_share, idle_at_end_share;
} AttentionProbeSummary;

typedef struct {
    long long start, end;
} ProbeInterval;

static inline int probe_interval_by_start(const void *a, const void *b) {
    const ProbeInterval *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

// The summary of `count` records, PROBE_WARPS_PER_BLOCK a block.
static inline AttentionProbeSummary summarize_attention_probe(const OpsAttentionProbeRecord *records, long count) {
    AttentionProbeSummary summary = {0};
    long long first = -1, last = -1, block_ns_total = 0, block_ns_most = 0;
    double cycles = 0, waiting = 0, steps = 0, warp_ns = 0;
    const long most_blocks = count / PROBE_WARPS_PER_BLOCK;
    ProbeInterval *intervals = xmalloc((size_t)(most_blocks + 1) * sizeof(ProbeInterval));
    ProbeInterval *mine = xmalloc((size_t)(most_blocks + 1) * sizeof(ProbeInterval));
    int *sm_of = xmalloc((size_t)(most_blocks + 1) * sizeof(int));
    long blocks = 0;
    for (long b = 0; b < most_blocks; b++) {
        const OpsAttentionProbeRecord *w = records + b * PROBE_WARPS_PER_BLOCK;
        if (w[0].end_ns == 0) continue; // returned before its loop
        long long start = w[0].start_ns, end = w[0].end_ns;
        for (int i = 0; i < PROBE_WARPS_PER_BLOCK; i++) {
            if (w[i].start_ns < start) start = w[i].start_ns;
            if (w[i].end_ns > end) end = w[i].end_ns;
            cycles += (double)w[i].cycles, waiting += (double)w[i].waiting_cycles, steps += w[i].steps;
            warp_ns += (double)(w[i].end_ns - w[i].start_ns);
        }
        if (first < 0 || start < first) first = start;
        if (end > last) last = end;
        block_ns_total += end - start;
        if (end - start > block_ns_most) block_ns_most = end - start;
        intervals[blocks] = (ProbeInterval){start, end};
        sm_of[blocks] = w[0].sm >= 0 && w[0].sm < PROBE_MOST_SMS ? w[0].sm : 0;
        blocks++;
    }
    summary.blocks = blocks;
    if (blocks > 0) {
        const double span = (double)(last - first);
        // Per SM: its blocks by start; the most running when one starts, the time at least
        // one ran, the block-time, and the idle time after its last block.
        double busy = 0, resident = 0, idle_at_end = 0;
        for (int sm = 0; sm < PROBE_MOST_SMS; sm++) {
            long n = 0;
            for (long i = 0; i < blocks; i++)
                if (sm_of[i] == sm) mine[n++] = intervals[i];
            if (n == 0) continue;
            summary.sms++;
            qsort(mine, (size_t)n, sizeof *mine, probe_interval_by_start);
            long long covered = 0, reach = mine[0].start, sm_last = 0;
            for (long i = 0; i < n; i++) {
                int at_once = 1; // block i and those started before it still running
                for (long j = 0; j < i; j++)
                    if (mine[j].end > mine[i].start) at_once++;
                if (at_once > summary.resident_blocks_max) summary.resident_blocks_max = at_once;
                const long long from = mine[i].start > reach ? mine[i].start : reach;
                if (mine[i].end > from) covered += mine[i].end - from;
                if (mine[i].end > reach) reach = mine[i].end;
                if (mine[i].end > sm_last) sm_last = mine[i].end;
                resident += (double)(mine[i].end - mine[i].start);
            }
            busy += (double)covered;
            idle_at_end += (double)(last - sm_last);
        }
        summary.span_us = span / 1e3;
        summary.block_us_mean = (double)block_ns_total / (double)blocks / 1e3;
        summary.block_us_max = (double)block_ns_most / 1e3;
        summary.steps_per_block_mean = steps / PROBE_WARPS_PER_BLOCK / (double)blocks;
        summary.cycles_per_step = steps > 0 ? cycles / steps : 0.0;
        summary.waiting_share = cycles > 0 ? waiting / cycles : 0.0;
        summary.clock_ghz = warp_ns > 0 ? cycles / warp_ns : 0.0;
        if (span > 0) {
            summary.resident_blocks_mean = resident / (span * summary.sms);
            summary.sm_busy_share = busy / (span * summary.sms);
            summary.idle_at_end_share = idle_at_end / (span * summary.sms);
        }
    }
    free(mine), free(intervals), free(sm_of);
    return summary;
}

static inline void print_attention_probe_summary(const char *kernel, const char *attention, int head_dim,
                                          const AttentionProbeSummary *s) {
    printf("{\"attention_probe\": \"%s\", \"attention\": \"%s\", \"head_dim\": %d, \"blocks\": %ld, \"sms\": %d, "
           "\"span_us\": %.1f, \"block_us_mean\": %.2f, \"block_us_max\": %.2f, \"steps_per_block_mean\": %.2f, "
           "\"cycles_per_step\": %.0f, \"waiting_share\": %.3f, \"clock_ghz\": %.3f, \"resident_blocks_max\": %d, "
           "\"resident_blocks_mean\": %.2f, \"sm_busy_share\": %.3f, \"idle_at_end_share\": %.3f}\n",
           kernel, attention, head_dim, s->blocks, s->sms, s->span_us, s->block_us_mean, s->block_us_max,
           s->steps_per_block_mean, s->cycles_per_step, s->waiting_share, s->clock_ghz, s->resident_blocks_max,
           s->resident_blocks_mean, s->sm_busy_share, s->idle_at_end_share);
}
