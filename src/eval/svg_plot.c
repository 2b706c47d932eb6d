// Line plots as inline SVG: one plot, several series (runs) overlaid, with axes, five
// ticks per axis and a legend. Plain text out; no state.
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

void svg_line_plot(FILE *out, const char *title, const SvgSeries *series, int count) {
    const double width = 420, height = 240, left = 58, right = 12, top = 28, bottom = 34;
    double x_min = INFINITY, x_max = -INFINITY, y_min = INFINITY, y_max = -INFINITY;
    for (int s = 0; s < count; s++)
        for (int i = 0; i < series[s].count; i++) {
            double x = series[s].x[i], y = series[s].y[i];
            if (!isfinite(x) || !isfinite(y)) continue;
            x_min = fmin(x_min, x), x_max = fmax(x_max, x);
            y_min = fmin(y_min, y), y_max = fmax(y_max, y);
        }
    fprintf(out, "<svg class=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" "
                 "viewBox=\"0 0 %g %g\" role=\"img\"><title>", width, height, width, height);
    svg_write_escaped(out, title);
    fprintf(out, "</title><text x=\"%g\" y=\"18\" class=\"plot-title\">", left);
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
    fprintf(out, "<text x=\"%g\" y=\"%g\" class=\"axis\" text-anchor=\"middle\">iteration / step</text>",
            left + plot_w / 2, height - 4);
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
    for (int s = 0; s < count; s++) { // legend, top right inside the frame
        double y = top + 12 + 13 * s;
        fprintf(out, "<rect x=\"%g\" y=\"%g\" width=\"10\" height=\"3\" fill=\"%s\"/>", left + plot_w - 130, y - 4,
                svg_series_colour(series[s].colour));
        fprintf(out, "<text x=\"%g\" y=\"%g\" class=\"legend\">", left + plot_w - 116, y);
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
