// Line plots as SVG: one plot, several series (runs) overlaid, with axes, five ticks per
// axis, a legend and optional min-max bands. Inline in an HTML page (the page styles the
// classes) or a standalone file (its own style). Plain text out; no state.
#include "eval/svg_plot.h"

#include <math.h>
#include <stdio.h>

// Colours that stay apart for the usual 2-8 runs (Tableau 10).
static const char *palette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};

const char *svg_series_colour(int index) { return palette[index % (int)(sizeof palette / sizeof palette[0])]; }

// A tick label without trailing noise: 3 significant digits.
static void tick_label(char *out, size_t size, double value) {
    if (value != 0 && (fabs(value) >= 1e5 || fabs(value) < 1e-3)) snprintf(out, size, "%.2e", value);
    else snprintf(out, size, "%.3g", value);
}

// The classes' style for a standalone file (a report page has the same rules in its own).
static const char *standalone_style =
    "text{font-family:system-ui,sans-serif}.plot-title{font-size:13px;font-weight:600}"
    ".tick,.axis,.legend{font-size:10px;fill:#444}.frame{fill:none;stroke:#999}.grid{stroke:#eee}"
    ".no-data{font-size:12px;fill:#999}";

// Point i of the series' band, if it has one and the point is finite.
static bool band_point(const SvgSeries *s, int i) {
    return s->y_low && s->y_high && isfinite(s->x[i]) && isfinite(s->y_low[i]) && isfinite(s->y_high[i]);
}

void svg_line_plot(FILE *out, const char *title, const SvgSeries *series, int count) {
    svg_line_plot_with(out, title, series, count, NULL);
}

void svg_line_plot_with(FILE *out, const char *title, const SvgSeries *series, int count,
                        const SvgPlotOptions *options) {
    const SvgPlotOptions defaults = {0};
    if (!options) options = &defaults;
    // Inline plots are small and carry the legend inside the frame (a report has dozens of
    // them, with a few runs each); a standalone figure is larger and keeps its legend in a
    // column of its own on the right, so that many series never hide a line.
    const double legend_w = options->standalone ? 210 : 0;
    const double width = (options->standalone ? 620 : 420) + legend_w, height = options->standalone ? 320 : 240;
    const double left = 58, right = 12 + legend_w, top = 28, bottom = 34;
    double x_min = INFINITY, x_max = -INFINITY, y_min = INFINITY, y_max = -INFINITY;
    for (int s = 0; s < count; s++)
        for (int i = 0; i < series[s].count; i++) {
            double x = series[s].x[i], y = series[s].y[i];
            if (band_point(&series[s], i)) { // the band counts even where the line has no point
                x_min = fmin(x_min, x), x_max = fmax(x_max, x);
                y_min = fmin(y_min, series[s].y_low[i]), y_max = fmax(y_max, series[s].y_high[i]);
            }
            if (!isfinite(x) || !isfinite(y)) continue;
            x_min = fmin(x_min, x), x_max = fmax(x_max, x);
            y_min = fmin(y_min, y), y_max = fmax(y_max, y);
        }
    if (options->standalone) fputs("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n", out);
    fprintf(out, "<svg class=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" "
                 "viewBox=\"0 0 %g %g\" role=\"img\"><title>", width, height, width, height);
    svg_write_escaped(out, title);
    fputs("</title>", out);
    if (options->standalone)
        fprintf(out, "<style>%s</style><rect width=\"%g\" height=\"%g\" fill=\"#fff\"/>", standalone_style, width,
                height);
    fprintf(out, "<text x=\"%g\" y=\"18\" class=\"plot-title\">", left);
    svg_write_escaped(out, title);
    fprintf(out, "</text>");
    if (!isfinite(x_min)) { // no finite point at all
        fprintf(out, "<text x=\"%g\" y=\"%g\" class=\"no-data\">no data</text></svg>\n", left, height / 2);
        return;
    }
    if (x_max == x_min) x_min -= 0.5, x_max += 0.5;
    if (y_max == y_min) y_min -= fabs(y_min) * 0.05 + 0.5, y_max += fabs(y_max) * 0.05 + 0.5;
    double pad = (y_max - y_min) * 0.05;
    y_min -= pad, y_max += pad;
    const double plot_w = width - left - right, plot_h = height - top - bottom;
#define PX(x) (left + ((x) - x_min) / (x_max - x_min) * plot_w)
#define PY(y) (top + (1.0 - ((y) - y_min) / (y_max - y_min)) * plot_h)
    fprintf(out, "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" class=\"frame\"/>", left, top, plot_w, plot_h);
    char label[32];
    for (int t = 0; t <= 4; t++) {
        double y = y_min + (y_max - y_min) * t / 4, x = x_min + (x_max - x_min) * t / 4;
        tick_label(label, sizeof label, y);
        fprintf(out, "<line x1=\"%g\" x2=\"%g\" y1=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>", left, left + plot_w, PY(y), PY(y));
        fprintf(out, "<text x=\"%g\" y=\"%.1f\" class=\"tick\" text-anchor=\"end\">%s</text>", left - 4, PY(y) + 3, label);
        tick_label(label, sizeof label, x);
        fprintf(out, "<text x=\"%.1f\" y=\"%g\" class=\"tick\" text-anchor=\"middle\">%s</text>", PX(x),
                top + plot_h + 14, label);
    }
    fprintf(out, "<text x=\"%g\" y=\"%g\" class=\"axis\" text-anchor=\"middle\">", left + plot_w / 2, height - 4);
    svg_write_escaped(out, options->x_label ? options->x_label : "iteration / step");
    fputs("</text>", out);
    if (options->y_label) {
        fprintf(out, "<text x=\"12\" y=\"%g\" class=\"axis\" text-anchor=\"middle\" transform=\"rotate(-90 12 %g)\">",
                top + plot_h / 2, top + plot_h / 2);
        svg_write_escaped(out, options->y_label);
        fputs("</text>", out);
    }
    for (int s = 0; s < count; s++) { // bands first, so that every line is drawn over them
        const char *colour = svg_series_colour(series[s].colour);
        int finite = 0, last = -1;
        for (int i = 0; i < series[s].count; i++)
            if (band_point(&series[s], i)) finite++, last = i;
        if (finite == 1) { // a single point's band is a bar
            fprintf(out, "<line class=\"band\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                         "stroke-opacity=\"0.35\" stroke-width=\"4\"/>",
                    PX(series[s].x[last]), PX(series[s].x[last]), PY(series[s].y_low[last]),
                    PY(series[s].y_high[last]), colour);
        } else if (finite > 1) { // the upper edge left to right, then the lower edge back
            fprintf(out, "<polygon class=\"band\" fill=\"%s\" fill-opacity=\"0.2\" stroke=\"none\" points=\"", colour);
            for (int i = 0; i < series[s].count; i++)
                if (band_point(&series[s], i)) fprintf(out, "%.1f,%.1f ", PX(series[s].x[i]), PY(series[s].y_high[i]));
            for (int i = series[s].count - 1; i >= 0; i--)
                if (band_point(&series[s], i)) fprintf(out, "%.1f,%.1f ", PX(series[s].x[i]), PY(series[s].y_low[i]));
            fputs("\"/>", out);
        }
    }
    for (int s = 0; s < count; s++) {
        const char *colour = svg_series_colour(series[s].colour);
        int finite = 0;
        for (int i = 0; i < series[s].count; i++) finite += isfinite(series[s].x[i]) && isfinite(series[s].y[i]);
        if (finite == 0) continue;
        if (finite == 1) { // a single point shows as a dot
            for (int i = 0; i < series[s].count; i++)
                if (isfinite(series[s].x[i]) && isfinite(series[s].y[i]))
                    fprintf(out, "<circle class=\"series\" cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>",
                            PX(series[s].x[i]), PY(series[s].y[i]), colour);
            continue;
        }
        fprintf(out, "<polyline class=\"series\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" points=\"", colour);
        for (int i = 0; i < series[s].count; i++)
            if (isfinite(series[s].x[i]) && isfinite(series[s].y[i]))
                fprintf(out, "%.1f,%.1f ", PX(series[s].x[i]), PY(series[s].y[i]));
        fprintf(out, "\"/>");
    }
    // The legend: top right inside the frame, or in its column right of the frame.
    const double legend_x = options->standalone ? left + plot_w + 14 : left + plot_w - 130;
    for (int s = 0; s < count; s++) {
        double y = top + 12 + 13 * s;
        fprintf(out, "<rect x=\"%g\" y=\"%g\" width=\"10\" height=\"3\" fill=\"%s\"/>", legend_x, y - 4,
                svg_series_colour(series[s].colour));
        fprintf(out, "<text x=\"%g\" y=\"%g\" class=\"legend\">", legend_x + 14, y);
        svg_write_escaped(out, series[s].label);
        fprintf(out, "</text>");
    }
#undef PX
#undef PY
    fprintf(out, "</svg>\n");
}

void svg_write_escaped(FILE *out, const char *text) {
    for (const char *c = text; *c; c++) {
        switch (*c) {
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '&': fputs("&amp;", out); break;
        case '"': fputs("&quot;", out); break;
        default: fputc(*c, out);
        }
    }
}
