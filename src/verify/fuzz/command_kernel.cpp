// src/verify/fuzz/command_kernel.cpp — the --cmd kernel: a case handed to an external program
// through two folders (docs/fuzz-protocol.md).
//
// The program runs under /bin/sh -c in a process group of its own, so that a timeout kills
// everything it started (a shell, its interpreter, their children) with one kill(-pgid). Its
// stdout and stderr are read through pipes while it runs (a full pipe would otherwise stall it),
// and only their last bytes are kept: a crash report needs the tail, and a chatty program must
// not grow the fuzzer's memory without bound.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "oasis/core/error.hpp"
#include "oasis/io/npy.hpp"
#include "oasis/verify/fuzz.hpp"

extern char** environ;

namespace oasis::verify::fuzz {
namespace {

namespace fs = std::filesystem;

/// Bytes of each stream kept (the tail); 64 KiB holds far more than the 20 lines reported.
constexpr std::size_t kKeepBytes = 64 * 1024;
constexpr int kTailLines = 20;
/// After the program exits, its pipes are drained for at most this long: a process that left
/// the group (setsid) and holds them open must not stall the fuzzer.
constexpr int kDrainMs = 1000;

void write_json(const io::json::Value& v, std::string& out) {
  using K = io::json::Value::Kind;
  switch (v.kind) {
    case K::null: out += "null"; return;
    case K::boolean: out += v.b ? "true" : "false"; return;
    case K::number: out += v.text; return;  // the literal as parsed: integers stay exact
    case K::string: out += io::json::quote(v.text); return;
    case K::array:
      out += '[';
      for (std::size_t i = 0; i < v.items.size(); ++i) {
        if (i) out += ", ";
        write_json(v.items[i], out);
      }
      out += ']';
      return;
    case K::object:
      out += '{';
      for (std::size_t i = 0; i < v.members.size(); ++i) {
        if (i) out += ", ";
        out += io::json::quote(v.members[i].first) + ": ";
        write_json(v.members[i].second, out);
      }
      out += '}';
      return;
  }
}

/// 'path' for /bin/sh: single quotes, each ' written as '\''.
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

/// A fresh folder under the system's temporary directory (mkdtemp: unique, mode 0700).
std::string make_temp_dir(const char* stem) {
  std::string templ = (fs::temp_directory_path() / (std::string(stem) + "-XXXXXX")).string();
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw std::runtime_error("cannot create a temporary folder " + templ + ": " + std::strerror(errno));
  return buf.data();
}

/// Removes the call's folders on every exit path, unless OASIS_FUZZ_KEEP is set (then names them).
struct TempDirs {
  std::string in, out;
  TempDirs() : in(make_temp_dir("oasis-fuzz-in")) {
    try {
      out = make_temp_dir("oasis-fuzz-out");
    } catch (...) {
      std::error_code ec;
      fs::remove_all(in, ec);
      throw;
    }
  }
  ~TempDirs() {
    if (std::getenv("OASIS_FUZZ_KEEP")) {
      std::cerr << "oasis-verify fuzz: kept " << in << " and " << out << " (OASIS_FUZZ_KEEP)\n";
      return;
    }
    std::error_code ec;
    fs::remove_all(in, ec);
    fs::remove_all(out, ec);
  }
  TempDirs(const TempDirs&) = delete;
  TempDirs& operator=(const TempDirs&) = delete;
};

/// A pipe's read end (closed on destruction).
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

void append_tail(std::string& buf, const char* p, std::size_t n) {
  buf.append(p, n);
  if (buf.size() > 2 * kKeepBytes) buf.erase(0, buf.size() - kKeepBytes);
}

/// Reads what is available on the open fds (poll for up to `wait_ms`); an fd at EOF is closed
/// and set to -1.
void pump(Fd* fds, std::string* bufs, int wait_ms) {
  pollfd p[2];
  int n = 0, which[2];
  for (int i = 0; i < 2; ++i)
    if (fds[i].fd >= 0) {
      p[n] = {fds[i].fd, POLLIN, 0};
      which[n++] = i;
    }
  if (n == 0) {
    if (wait_ms > 0) poll(nullptr, 0, wait_ms);
    return;
  }
  if (poll(p, static_cast<nfds_t>(n), wait_ms) <= 0) return;
  for (int k = 0; k < n; ++k) {
    if (!(p[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    char chunk[8192];
    const ssize_t got = read(p[k].fd, chunk, sizeof chunk);
    if (got > 0) {
      append_tail(bufs[which[k]], chunk, static_cast<std::size_t>(got));
    } else if (got == 0 || errno != EINTR) {
      close(fds[which[k]].fd);
      fds[which[k]].fd = -1;
    }
  }
}

/// The last `lines` lines of `s`, each indented for the report.
std::string tail_lines(const std::string& s, int lines) {
  std::vector<std::string> all;
  std::size_t at = 0;
  while (at < s.size()) {
    const std::size_t nl = s.find('\n', at);
    all.push_back(s.substr(at, nl == std::string::npos ? std::string::npos : nl - at));
    if (nl == std::string::npos) break;
    at = nl + 1;
  }
  while (!all.empty() && all.back().find_first_not_of(" \t\r") == std::string::npos) all.pop_back();
  std::string out;
  for (std::size_t i = all.size() > static_cast<std::size_t>(lines) ? all.size() - lines : 0; i < all.size(); ++i)
    out += "\n    | " + all[i];
  return out;
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGPIPE: return "SIGPIPE";
    default: return "signal " + std::to_string(sig);
  }
}

struct Outcome {
  bool timed_out = false;
  int status = 0;  ///< waitpid's status
  std::string out, err;
};

/// Runs `cmd` with /bin/sh -c in its own process group, stdin from /dev/null, until it exits or
/// `timeout_s` (<= 0: none) passes; then kills the group.
Outcome run_shell(const std::string& cmd, double timeout_s) {
  int po[2], pe[2];
  if (pipe2(po, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  if (pipe2(pe, O_CLOEXEC) != 0) {
    close(po[0]), close(po[1]);
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  const int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  const char* argv[] = {"sh", "-c", cmd.c_str(), nullptr};
  const pid_t pid = fork();
  if (pid == 0) {
    // Child: async-signal-safe calls only (the parent may have threads).
    setpgid(0, 0);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(po[1], 1);
    dup2(pe[1], 2);
    execve("/bin/sh", const_cast<char* const*>(argv), environ);
    _exit(127);
  }
  const int fork_errno = errno;
  if (devnull >= 0) close(devnull);
  close(po[1]);
  close(pe[1]);
  Fd fds[2];
  fds[0].fd = po[0];
  fds[1].fd = pe[0];
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(fork_errno));
  setpgid(pid, pid);  // also here: the child may not have run yet when the group is killed

  Outcome r;
  std::string bufs[2];
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  for (;;) {
    pump(fds, bufs, 20);
    // WNOWAIT: the exited child stays a zombie, which keeps its pid, and so the group id killed
    // below, from being reused by an unrelated process.
    siginfo_t info{};
    int w;
    do w = waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT);
    while (w < 0 && errno == EINTR);
    if (w < 0) {
      const std::string why = std::strerror(errno);
      kill(-pid, SIGKILL);
      waitpid(pid, &r.status, 0);
      throw std::runtime_error("waitid: " + why);
    }
    if (info.si_pid == pid) break;
    if (timeout_s > 0 && std::chrono::duration<double>(clock::now() - start).count() > timeout_s) {
      r.timed_out = true;
      break;
    }
  }
  // What the program left behind in its group (a background job) dies with the call.
  kill(-pid, SIGKILL);
  while (waitpid(pid, &r.status, 0) < 0 && errno == EINTR) {
  }
  const auto drain_end = clock::now() + std::chrono::milliseconds(kDrainMs);
  while ((fds[0].fd >= 0 || fds[1].fd >= 0) && clock::now() < drain_end) pump(fds, bufs, 20);
  r.out = std::move(bufs[0]);
  r.err = std::move(bufs[1]);
  return r;
}

/// The tensor name of an output file: without .npy and a trailing .bf16 or .f16.
std::string tensor_name(const std::string& file) {
  std::string n = file.substr(0, file.size() - 4);
  for (const char* suffix : {".bf16", ".f16"})
    if (io::detail::ends_with(n, suffix)) return n.substr(0, n.size() - std::strlen(suffix));
  return n;
}

}  // namespace

Kernel command_kernel(const std::string& command, double timeout_s) {
  OASIS_REQUIRE(command.find("{in}") != std::string::npos && command.find("{out}") != std::string::npos, "--cmd",
                "the command must name both folders, {in} and {out} (got '", command, "')");
  OASIS_REQUIRE(timeout_s >= 0, "--timeout", "must be >= 0 seconds (0: none), got ", timeout_s);
  return [command, timeout_s](const io::TensorMap& inputs, const io::json::Value& options) -> io::TensorMap {
    TempDirs dirs;
    for (const auto& [name, t] : inputs)
      io::write_npy((fs::path(dirs.in) / (name + (t.dtype == io::DType::bf16 ? ".bf16.npy" : ".npy"))).string(), t);
    {
      std::string text;
      write_json(options, text);
      std::ofstream f(fs::path(dirs.in) / "options.json", std::ios::binary | std::ios::trunc);
      f << text << "\n";
      if (!f) throw std::runtime_error("cannot write " + (fs::path(dirs.in) / "options.json").string());
    }
    const std::string cmd =
        replace_all(replace_all(command, "{in}", shell_quote(dirs.in)), "{out}", shell_quote(dirs.out));
    const Outcome r = run_shell(cmd, timeout_s);
    // Messages name the command as given: the substituted folders are gone after the call. The
    // report shows stderr's last lines, or stdout's when stderr is empty (some programs print
    // their errors there).
    const std::string err_tail = tail_lines(r.err, kTailLines), out_tail = tail_lines(r.out, kTailLines);
    const std::string said = !err_tail.empty() ? ", its stderr ends:" + err_tail
                             : !out_tail.empty() ? " (nothing on stderr), its stdout ends:" + out_tail
                                                 : std::string(" (nothing on stderr)");
    if (r.timed_out) {
      std::string secs = std::to_string(timeout_s);
      secs.erase(secs.find_last_not_of('0') + 1);
      if (!secs.empty() && secs.back() == '.') secs.pop_back();
      throw kernel_timeout("the program ran past the " + secs + " s limit and was killed: " + command + said);
    }
    if (WIFSIGNALED(r.status))
      throw std::runtime_error("the program was killed by signal " + std::to_string(WTERMSIG(r.status)) + " (" +
                               signal_name(WTERMSIG(r.status)) + "): " + command + said);
    if (WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0)
      throw std::runtime_error("the program failed with exit status " + std::to_string(WEXITSTATUS(r.status)) +
                               (WEXITSTATUS(r.status) == 127 ? " (command not found?)" : "") + ": " + command + said);

    io::TensorMap outputs;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dirs.out))
      if (e.is_regular_file() && io::detail::ends_with(e.path().filename().string(), ".npy")) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    if (files.empty()) throw std::runtime_error("the program wrote no outputs (no *.npy in {out}): " + command + said);
    for (const fs::path& p : files) {
      const std::string name = tensor_name(p.filename().string());
      if (outputs.count(name))
        throw std::runtime_error("the program wrote output '" + name + "' twice (" + p.filename().string() +
                                 " and another file of that name)");
      try {
        outputs.emplace(name, io::read_npy(p.string()));
      } catch (const std::exception& e) {
        // A malformed output is the program's fault (a crash), not a usage error of the fuzzer.
        throw std::runtime_error(std::string("the program wrote an unreadable output: ") + e.what());
      }
    }
    return outputs;
  };
}

}  // namespace oasis::verify::fuzz
