// verify/figures_cmd.cpp — `oasis-verify figures MODEL TRACE --out DIR`.
//
// The numbers come from the library (oasis/verify/figures.hpp) and are written as CSV; the PNGs
// are drawn from the CSVs by the plotting script the package ships (src/python/oasis/_figures.py,
// installed as share/oasis/oasis_figures.py beside bin/), run by Debian's /usr/bin/python3 with
// python3-matplotlib (OASIS_PYTHON names another interpreter, OASIS_FIGURES_SCRIPT another script).
#include "exit_status.hpp"
#include "figures_cmd.hpp"

#include <cstdlib>
#include <filesystem>
#include <iostream>

#if defined(__unix__)
#include <sys/wait.h>
#include <unistd.h>
#endif

#include "oasis/io/safetensors.hpp"
#include "oasis/model/io.hpp"
#include "oasis/verify/figures.hpp"

namespace oasis::verify {
namespace {

/// The plotting script's exit status when matplotlib cannot be imported.
constexpr int kNoMatplotlib = 3;

const char* kFiguresHelp =
    "usage: oasis-verify figures MODEL TRACE --out DIR\n"
    "\n"
    "Draws the paper's diagnostics of a model trace with the library's own metrics (docs/report.md):\n"
    "  null_mass      token null mass per layer x head (the sink map)\n"
    "  depth_weights  alpha and alpha_null of every router over its sources\n"
    "  psi            psi per layer\n"
    "  outliers       kurtosis and max |x| of the residual stream per sublayer (the paper's Figure 3)\n"
    "  sink_rate      sink rate per layer (Gu et al. 2025)\n"
    "MODEL is a weights file of oasis::model::save_model (its configuration in the metadata), TRACE a\n"
    ".safetensors file of trace tensors named as op model reads them (docs/verify-model.md). Each\n"
    "figure is written as DIR/<name>.png with its numbers in DIR/<name>.csv; a figure whose tensors\n"
    "the trace lacks is left out and named. The PNGs need python3-matplotlib (the CSVs do not).\n"
    "Exit status: 0 written, 2 usage or input error (unreadable file, unwritable DIR, no matplotlib).\n"
    "  --out DIR        the output directory (created when missing)\n";

int usage(const std::string& msg) {
  std::cerr << "oasis-verify figures: " << msg << "\n\n" << kFiguresHelp;
  return kUsage;
}

/// The plotting script: $OASIS_FIGURES_SCRIPT, else share/oasis/oasis_figures.py beside this
/// program's bin/ (the installed layout; the build tree has the same one).
std::string plot_script() {
  if (const char* s = std::getenv("OASIS_FIGURES_SCRIPT")) return s;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  return (exe.parent_path().parent_path() / "share" / "oasis" / "oasis_figures.py").string();
}

std::string python() {
  if (const char* s = std::getenv("OASIS_PYTHON")) return s;
  return std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
}

/// Runs `py script dir`; its exit status (127: not started).
int run_plot(const std::string& py, const std::string& script, const std::string& dir) {
#if defined(__unix__)
  const pid_t pid = fork();
  if (pid < 0) return 127;
  if (pid == 0) {
    const char* argv[] = {py.c_str(), script.c_str(), dir.c_str(), nullptr};
    execvp(argv[0], const_cast<char* const*>(argv));
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status)) return 127;
  return WEXITSTATUS(status);
#else
  (void)py, (void)script, (void)dir;
  return 127;
#endif
}

}  // namespace

int cmd_figures(const std::vector<std::string>& args) {
  std::vector<std::string> files;
  std::string out;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::cout << kFiguresHelp;
      return kOk;
    }
    if (a == "--out") {
      if (i + 1 >= args.size()) return usage("--out needs a directory");
      out = args[++i];
    } else if (!a.empty() && a[0] == '-') {
      return usage("unknown option '" + a + "'");
    } else {
      files.push_back(a);
    }
  }
  if (files.size() != 2) return usage("needs MODEL and TRACE (got " + std::to_string(files.size()) + " files)");
  if (out.empty()) return usage("missing --out DIR");
  FigureSet set;
  try {
    const model::ModelConfig cfg = model::load_model<double>(files[0]).config();
    set = model_figures(cfg, io::read_safetensors(files[1]));
    write_figure_tables(set, out);
  } catch (const std::exception& e) {
    std::cerr << "oasis-verify figures: " << e.what() << "\n";
    return kUsage;
  }
  const std::string script = plot_script(), py = python();
  if (script.empty() || !std::filesystem::exists(script)) {
    std::cerr << "oasis-verify figures: the plotting script '" << script << "' is missing (set OASIS_FIGURES_SCRIPT); "
              << "the CSVs are in " << out << "\n";
    return kUsage;
  }
  const int rc = run_plot(py, script, out);
  if (rc != 0) {
    std::cerr << "oasis-verify figures: "
              << (rc == kNoMatplotlib ? py + " cannot import matplotlib (Debian: apt-get install python3-matplotlib)"
                  : rc == 127     ? "cannot run " + py + " (set OASIS_PYTHON)"
                                  : "the plotting script failed (exit " + std::to_string(rc) + ")")
              << "; the CSVs are in " << out << "\n";
    return kUsage;
  }
  for (const FigureTable& f : set.figures)
    std::cout << (std::filesystem::path(out) / (f.name + ".png")).string() << "  " << f.title << " (numbers in " << f.name
              << ".csv)\n";
  for (const std::string& l : set.left_out) std::cout << "left out: " << l << "\n";
  return kOk;
}

}  // namespace oasis::verify
