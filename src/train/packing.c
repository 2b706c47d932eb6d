#include "train/packing.h"

#include <stdlib.h>
#include <string.h>

#include "core/check.h"

int packing_strategy_parse(const char *name) {
    if (!strcmp(name, "bfd")) return PACKING_BFD;
    if (!strcmp(name, "bfd_split")) return PACKING_BFD_SPLIT;
    if (!strcmp(name, "wrapped")) return PACKING_WRAPPED;
    return -1;
}

const char *packing_strategy_name(PackingStrategy strategy) {
    switch (strategy) {
    case PACKING_BFD: return "bfd";
    case PACKING_BFD_SPLIT: return "bfd_split";
    case PACKING_WRAPPED: return "wrapped";
    }
    return "?";
}

// The output as it grows.
typedef struct {
    PackedRows *rows;
    long row_capacity, piece_capacity;
} Builder;

static void add_piece(Builder *b, PackedPiece piece) {
    if (b->rows->piece_count == b->piece_capacity) {
        b->piece_capacity = b->piece_capacity ? 2 * b->piece_capacity : 64;
        b->rows->pieces = xrealloc(b->rows->pieces, (size_t)b->piece_capacity * sizeof(PackedPiece));
    }
    b->rows->pieces[b->rows->piece_count++] = piece;
}

// Ends the row whose pieces were added since the last one ended.
static void end_row(Builder *b) {
    if (b->rows->rows + 2 > b->row_capacity) {
        b->row_capacity = b->row_capacity ? 2 * b->row_capacity : 64;
        b->rows->row_first = xrealloc(b->rows->row_first, (size_t)b->row_capacity * sizeof(long));
    }
    b->rows->row_first[++b->rows->rows] = b->rows->piece_count;
}

// wrapped: the block's sequences as one stream, cut every row_length tokens.
static void pack_wrapped(Builder *b, const int *lengths, long first, long end, int row_length) {
    int filled = 0;
    for (long i = first; i < end; i++)
        for (int taken = 0; taken < lengths[i];) {
            const int room = row_length - filled, left = lengths[i] - taken;
            const int length = left < room ? left : room;
            add_piece(b, (PackedPiece){i, taken, length});
            taken += length, filled += length;
            if (filled == row_length) end_row(b), filled = 0;
        }
    if (filled > 0) end_row(b);
}

// The free spaces rows have, 1..row_length, as a max segment tree (TRL's _SegmentTree):
// leaf s - 1 holds s while some row has s tokens free (row_length always: a new row), each
// node the larger of its children, so the smallest free space that holds a length is the
// leftmost leaf at least that length.
typedef struct {
    int leaves; // a power of two >= row_length
    int *node;  // [2 * leaves], node 1 the root
} SpaceTree;

static void space_tree_set(SpaceTree *tree, int space, int value) {
    int i = tree->leaves + space - 1;
    tree->node[i] = value;
    for (i /= 2; i >= 1; i /= 2) {
        const int left = tree->node[2 * i], right = tree->node[2 * i + 1];
        tree->node[i] = left >= right ? left : right;
    }
}

static int space_tree_smallest_fitting(const SpaceTree *tree, int length) {
    int i = 1;
    while (i < tree->leaves) i = tree->node[2 * i] >= length ? 2 * i : 2 * i + 1;
    return tree->node[i];
}

static const PackedPiece *sort_pieces;
// Longest first; equal lengths in their order (pyarrow's sort is stable).
static int longest_first(const void *x, const void *y) {
    const long a = *(const long *)x, b = *(const long *)y;
    if (sort_pieces[a].length != sort_pieces[b].length) return sort_pieces[a].length > sort_pieces[b].length ? -1 : 1;
    return a < b ? -1 : a > b;
}

// bfd and bfd_split over one block's pieces (sequences, cut or split into pieces of at most
// row_length), in their order.
static void pack_best_fit(Builder *b, const PackedPiece *pieces, long count, int row_length) {
    long *order = xmalloc((size_t)(count > 0 ? count : 1) * sizeof(long));
    for (long i = 0; i < count; i++) order[i] = i;
    sort_pieces = pieces;
    qsort(order, (size_t)count, sizeof(long), longest_first);
    SpaceTree tree = {1, NULL};
    while (tree.leaves < row_length) tree.leaves *= 2;
    tree.node = xcalloc((size_t)2 * tree.leaves, sizeof(int));
    space_tree_set(&tree, row_length, row_length);
    // Rows by free space, each space's rows first come first served (TRL's deque); the rows'
    // pieces as lists in the order they were put in.
    long *queue_head = xmalloc((size_t)(row_length + 1) * sizeof(long)), *queue_tail = xmalloc((size_t)(row_length + 1) * sizeof(long));
    for (int s = 0; s <= row_length; s++) queue_head[s] = queue_tail[s] = -1;
    long *next_in_queue = xmalloc((size_t)(count > 0 ? count : 1) * sizeof(long));
    long *row_head = xmalloc((size_t)(count > 0 ? count : 1) * sizeof(long)), *row_tail = xmalloc((size_t)(count > 0 ? count : 1) * sizeof(long));
    long *next_piece = xmalloc((size_t)(count > 0 ? count : 1) * sizeof(long));
    long rows = 0;
    for (long k = 0; k < count; k++) {
        const long piece = order[k];
        const int length = pieces[piece].length;
        int space = space_tree_smallest_fitting(&tree, length);
        long row;
        if (space < row_length) { // an open row with exactly this space: the first of them
            row = queue_head[space];
            queue_head[space] = next_in_queue[row];
            if (queue_head[space] < 0) {
                queue_tail[space] = -1;
                space_tree_set(&tree, space, 0);
            }
            row_tail[row] = next_piece[row_tail[row]] = piece;
        } else { // a new row
            row = rows++;
            row_head[row] = row_tail[row] = piece;
        }
        next_piece[piece] = -1;
        space -= length;
        next_in_queue[row] = -1;
        if (queue_tail[space] >= 0) next_in_queue[queue_tail[space]] = row;
        else queue_head[space] = row;
        queue_tail[space] = row;
        if (space > 0) space_tree_set(&tree, space, space);
    }
    for (long row = 0; row < rows; row++) {
        for (long piece = row_head[row]; piece >= 0; piece = next_piece[piece]) add_piece(b, pieces[piece]);
        end_row(b);
    }
    free(order), free(tree.node), free(queue_head), free(queue_tail), free(next_in_queue);
    free(row_head), free(row_tail), free(next_piece);
}

void pack_sequences(const int *lengths, long count, int row_length, PackingStrategy strategy, PackedRows *out) {
    CHECK(row_length > 0, "packing into rows of %d tokens", row_length);
    memset(out, 0, sizeof *out);
    Builder b = {out, 64, 0};
    out->row_first = xmalloc((size_t)b.row_capacity * sizeof(long));
    out->row_first[0] = 0;
    PackedPiece *pieces = NULL;
    long piece_capacity = 0;
    for (long first = 0; first < count; first += PACKING_BLOCK) {
        const long end = first + PACKING_BLOCK < count ? first + PACKING_BLOCK : count;
        if (strategy == PACKING_WRAPPED) {
            pack_wrapped(&b, lengths, first, end, row_length);
            continue;
        }
        long n = 0;
        for (long i = first; i < end; i++) {
            const int pieces_of_it = strategy == PACKING_BFD ? 1 : (lengths[i] + row_length - 1) / row_length;
            if (n + pieces_of_it > piece_capacity) {
                piece_capacity = 2 * (n + pieces_of_it);
                pieces = xrealloc(pieces, (size_t)piece_capacity * sizeof(PackedPiece));
            }
            if (lengths[i] <= 0) continue; // TRL filters empty sequences out
            if (strategy == PACKING_BFD) {
                pieces[n++] = (PackedPiece){i, 0, lengths[i] < row_length ? lengths[i] : row_length};
                continue;
            }
            for (int taken = 0; taken < lengths[i]; taken += row_length) // full pieces, the last shorter
                pieces[n++] = (PackedPiece){i, taken, lengths[i] - taken < row_length ? lengths[i] - taken : row_length};
        }
        pack_best_fit(&b, pieces, n, row_length);
    }
    free(pieces);
}

void packed_rows_free(PackedRows *rows) {
    free(rows->row_first), free(rows->pieces);
    memset(rows, 0, sizeof *rows);
}
