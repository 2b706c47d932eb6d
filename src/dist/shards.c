#include "dist/shards.h"

#include <stdlib.h>

#include "core/check.h"
#include "dist/dist.h"

void shard_layout(long total, long *counts, long *displs) {
    const int world = dist_world_size();
    long chunk = ((total + world - 1) / world + 15) / 16 * 16;
    for (int r = 0; r < world; r++) {
        long begin = (long)r * chunk < total ? (long)r * chunk : total;
        long end = begin + chunk < total ? begin + chunk : total;
        displs[r] = begin;
        counts[r] = end - begin;
    }
}

void shard_overlap(const long *counts, const long *displs, int r, long from, long to, long *lo, long *hi) {
    *lo = from > displs[r] ? from : displs[r];
    *hi = to < displs[r] + counts[r] ? to : displs[r] + counts[r];
}

static int later_point_first(const void *a, const void *b) {
    const GradientSpan *x = a, *y = b;
    if (x->point != y->point) return x->point > y->point ? -1 : 1;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

GradientSpan *gradient_spans(const Model *model, bool frozen_base, int *count) {
    GradientSpan *spans = xmalloc((size_t)(model->table.count + 1) * sizeof(GradientSpan));
    int n = 0;
    for (int i = 0; i < model->table.count; i++) {
        const ParamEntry *e = &model->table.entries[i];
        if ((e->offset < model->trainable_offset) != frozen_base) continue; // the other region's
        const int point = model_gradient_point(model, e);
        const long begin = e->offset - (frozen_base ? 0 : model->trainable_offset), end = begin + e->numel;
        GradientSpan *last = n ? &spans[n - 1] : NULL;
        if (last && last->point == point) last->end = end;
        else spans[n++] = (GradientSpan){begin, end, point};
    }
    qsort(spans, (size_t)n, sizeof(GradientSpan), later_point_first);
    *count = n;
    return spans;
}
