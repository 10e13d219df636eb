// SPDX-License-Identifier: Apache-2.0
// ferry_bench_sinks' side of its reader process (shm_reader.cpp): this binary spawned again with --reader, its
// stdout piped and read line by line with a timeout; killed (SIGKILL) and reaped if still running at the end.
#include "sinks.hpp"

#include <cstring>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace ferry::bench::sinks {

reader_process::reader_process(const reader_args& a)
{
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) { throw std::runtime_error("ferry_bench_sinks: readlink /proc/self/exe failed"); }
  self[n] = 0;
  std::vector<std::string> args{self, "--reader", a.name, std::to_string(a.hooks), std::to_string(a.tokens),
                                std::to_string(a.entry_bytes), std::to_string(a.full_every), std::to_string(a.warmup),
                                std::to_string(a.checkers), a.fault ? "1" : "0"};
  std::vector<char*> argv;
  for (auto& x : args) { argv.push_back(x.data()); }
  argv.push_back(nullptr);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) { throw std::runtime_error("ferry_bench_sinks: pipe2 failed"); }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  const int rc = ::posix_spawn(&pid_, self, &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  out_ = fds[0];
  if (rc != 0) {
    pid_ = -1;
    throw std::runtime_error(std::string{"ferry_bench_sinks: posix_spawn of the reader: "} + std::strerror(rc));
  }
}

reader_process::~reader_process()
{
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int st = 0;
    ::waitpid(pid_, &st, 0);
  }
  if (out_ >= 0) { ::close(out_); }
}

std::optional<std::string> reader_process::line(std::chrono::milliseconds timeout)
{
  const auto end = clk::now() + timeout;
  for (;;) {
    if (const auto nl = buf_.find('\n'); nl != std::string::npos) {
      std::string l = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return l;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - clk::now()).count();
    if (left <= 0) { return std::nullopt; }
    pollfd p{out_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) { continue; }
    char b[4096];
    const ssize_t n = ::read(out_, b, sizeof b);
    if (n <= 0) { return std::nullopt; }
    buf_.append(b, static_cast<std::size_t>(n));
  }
}

bool reader_process::attached(std::chrono::milliseconds timeout)
{
  const auto l = line(timeout);
  return l && l->rfind("attached", 0) == 0;
}

reader_result reader_process::result(std::chrono::milliseconds timeout)
{
  reader_result r;
  const auto l = line(timeout);
  if (!l || l->rfind("result ", 0) != 0) {
    r.error = l ? *l : "the reader printed no result within " + std::to_string(timeout.count()) + " ms";
    return r;
  }
  const auto at = l->find(" first_bad=");
  r.first_bad = at == std::string::npos ? "" : l->substr(at + 11);
  std::istringstream in{l->substr(7, at == std::string::npos ? std::string::npos : at - 7)};
  for (std::string kv; in >> kv;) {
    const auto eq = kv.find('=');
    const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    if (k == "entries") { r.entries = std::stoull(v); }
    if (k == "bytes") { r.bytes = std::stoull(v); }
    if (k == "sampled") { r.sampled = std::stoull(v); }
    if (k == "full") { r.full = std::stoull(v); }
    if (k == "bad") { r.bad = std::stoull(v); }
    if (k == "gbps") { r.gbps = std::stod(v); }
    if (k == "seconds") { r.seconds = std::stod(v); }
  }
  const auto end = clk::now() + timeout;
  while (pid_ > 0 && clk::now() < end) {  // it exits by itself once it printed the result
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { r.error = "the reader exited with status " + std::to_string(st); }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return r;
}

}  // namespace ferry::bench::sinks
