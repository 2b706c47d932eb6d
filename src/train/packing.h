// Packing training sequences into rows of a fixed number of tokens (TRL's SFTConfig packing
// and packing_strategy; trl.data_utils.pack_dataset), so that a micro-batch is rows of about
// max_seq_len real tokens instead of examples padded to the longest:
//
//   bfd        Best Fit Decreasing (Ding et al. 2024, "Fewer Truncations Improve Language
//              Modeling"): sequences, each cut at the row length, longest first, each into
//              the row whose free space fits it most tightly (a new row when none does). Each
//              sequence stays whole and attends only to itself (model.h's segments).
//   bfd_split  the same, with the sequences longer than a row split into pieces of a row
//              (the last one shorter) instead of cut; each piece is a sequence of its own.
//   wrapped    every sequence one after the other, the stream cut every row-length tokens:
//              sequences run across rows and a row attends across the sequences in it.
//
// As TRL packs with datasets.map(batched=True), the sequences are packed in blocks of
// PACKING_BLOCK in their order (the map's default batch size): rows never mix sequences of
// two blocks, and each block's last wrapped row is shorter. The sorting and the choice of
// rows are TRL's, row for row (tests/fixtures/train/packing.json, from
// tools/make_packing_fixture.py).
#pragma once
#include <stdbool.h>

typedef enum { PACKING_BFD, PACKING_BFD_SPLIT, PACKING_WRAPPED } PackingStrategy;

enum { PACKING_BLOCK = 1000 };

// "bfd", "bfd_split", "wrapped" (TRL's names); -1 for anything else.
int packing_strategy_parse(const char *name);
const char *packing_strategy_name(PackingStrategy strategy);

// Tokens [first, first + length) of sequence `sequence`.
typedef struct {
    long sequence;
    int first, length;
} PackedPiece;

// The rows: row r is pieces [row_first[r], row_first[r + 1]), side by side in that order.
// A bfd or bfd_split row's pieces attend only to themselves (each a segment); a wrapped row
// is one stream.
typedef struct {
    long rows, piece_count;
    long *row_first; // [rows + 1]
    PackedPiece *pieces;
} PackedRows;

// Packs `count` sequences of lengths[i] tokens (0: left out, as TRL drops empty sequences)
// into rows of at most `row_length` tokens. bfd cuts longer sequences at row_length.
void pack_sequences(const int *lengths, long count, int row_length, PackingStrategy strategy, PackedRows *out);
void packed_rows_free(PackedRows *rows);
