// Line plots as SVG: inline in run reports (eval/report.c) or standalone .svg files
// (tools/reproduction_summary.c).
#pragma once
#include <stdbool.h>
#include <stdio.h>

typedef struct {
    const char *label; // legend text (the run's name)
    int colour;        // index into the palette (the run's index, so colours match across plots)
    const double *x, *y;
    int count;         // points; NaN and infinite values are skipped
    // Optional band around the line (e.g. min-max across seeds), `count` points each,
    // drawn as a translucent polygon in the series colour under the lines. NULL: none.
    const double *y_low, *y_high;
} SvgSeries;

typedef struct {
    const char *x_label; // axis title under the plot (NULL: "iteration / step")
    const char *y_label; // axis title left of the plot, rotated (NULL: none)
    bool standalone;     // a whole .svg file: XML declaration, white background, own style
} SvgPlotOptions;

// One <svg> element: the series overlaid on shared axes, with a title and a legend.
void svg_line_plot(FILE *out, const char *title, const SvgSeries *series, int count);
// The same with axis titles, or as a standalone file. options NULL: as svg_line_plot.
void svg_line_plot_with(FILE *out, const char *title, const SvgSeries *series, int count,
                        const SvgPlotOptions *options);
// The palette colour of series `index`.
const char *svg_series_colour(int index);
// Text with <, >, & and " escaped for HTML/SVG.
void svg_write_escaped(FILE *out, const char *text);
