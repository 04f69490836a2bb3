// oasis/verify/figures.hpp — the paper's diagnostics of a model trace, computed with the library's
// own metrics (oasis/research/metrics.hpp): the numbers behind `oasis-verify figures` and
// oasis.figures() (docs/report.md, "Figures").
//
// A trace holds the tensors of docs/verify-model.md ("Model level"). Each figure reads some of
// them; a figure whose tensors the trace lacks is left out and FigureSet::left_out says which
// tensor was missing (not an error). The tables are written as CSV; the PNGs are drawn from them
// by the plotting script src/python/oasis/figures.py (matplotlib).
#pragma once

#include <string>
#include <vector>

#include "oasis/io/dtype.hpp"

namespace oasis::model {
struct ModelConfig;
}

namespace oasis::verify {

/// The numbers of one figure: a table written as <name>.csv beside <name>.png.
struct FigureTable {
  std::string name;     ///< file stem: null_mass, depth_weights, psi, outliers, sink_rate
  std::string title;
  std::string caption;  ///< what it shows, the tensors it read, the paper's figure it reproduces
  /// How to draw it: "heatmap" (columns y, x, value), "lines" (column x, then one panel per column).
  std::string kind;
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;  ///< labels as text, numbers as %.17g (exact)
};

struct FigureSet {
  std::vector<FigureTable> figures;
  std::vector<std::string> left_out;  ///< "<name>: the trace lacks <tensor> [shape]"
};

/// The figures of a trace of the model configured by `config` (its attention sublayers' p_null,
/// branch_psi, attn_q, attn_k; its routers' alpha, alpha_null; its sublayers' inputs).
FigureSet model_figures(const model::ModelConfig& config, const io::TensorMap& trace);

/// Writes <dir>/<name>.csv per figure and <dir>/figures.json (name, title, caption, kind and
/// columns of each figure, and what was left out), creating `dir` when missing. An unwritable
/// directory or file throws oasis::invalid_argument naming it.
void write_figure_tables(const FigureSet& f, const std::string& dir);

}  // namespace oasis::verify
