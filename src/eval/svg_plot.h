// Line plots as inline SVG, for run reports (eval/report.c).
#pragma once
#include <stdio.h>

typedef struct {
    const char *label; // legend text (the run's name)
    int colour;        // index into the palette (the run's index, so colours match across plots)
    const double *x, *y;
    int count;         // points; NaN and infinite values are skipped
} SvgSeries;

// One <svg> element: the series overlaid on shared axes, with a title and a legend.
void svg_line_plot(FILE *out, const char *title, const SvgSeries *series, int count);
// The palette colour of series `index`.
const char *svg_series_colour(int index);
// Text with <, >, & and " escaped for HTML/SVG.
void svg_write_escaped(FILE *out, const char *text);
