// SPDX-License-Identifier: Apache-2.0
// A process of ferry_shm_child (shm_child.cpp) for the shared-memory stream tests: spawned with its arguments,
// its stdout read line by line (with a timeout), killed (SIGKILL) and reaped by the test or its destructor;
// "entry ..." lines parsed into records.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace ferry::test {

/// One "entry" line of the child: what it read, and whether every byte matched shm_pattern.
struct shm_record {
  std::uint64_t index, hook, seq, forward, tag, size, status, bytes_ok;
};

class shm_child {
 public:
  explicit shm_child(std::vector<std::string> args)
  {
    args.insert(args.begin(), FERRY_SHM_CHILD);
    std::vector<char*> argv;
    for (auto& a : args) { argv.push_back(a.data()); }
    argv.push_back(nullptr);
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) { throw std::runtime_error("pipe2"); }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    const int rc = ::posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(fds[1]);
    out_ = fds[0];
    if (rc != 0) { throw std::runtime_error("posix_spawn " + std::string{argv[0]}); }
  }
  shm_child(const shm_child&) = delete;
  shm_child& operator=(const shm_child&) = delete;
  ~shm_child()
  {
    kill();
    if (out_ >= 0) { ::close(out_); }
  }

  [[nodiscard]] pid_t pid() const noexcept { return pid_; }

  /// The next line of its stdout (without '\n'), or none after `timeout` or at its end.
  std::optional<std::string> line(std::chrono::milliseconds timeout = std::chrono::seconds(20))
  {
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (const auto nl = buf_.find('\n'); nl != std::string::npos) {
        std::string l = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return l;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0) { return std::nullopt; }
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) { continue; }
      char b[4096];
      const ssize_t n = ::read(out_, b, sizeof b);
      if (n <= 0) { return std::nullopt; }
      buf_.append(b, static_cast<std::size_t>(n));
    }
  }
  /// Lines up to (and without) the first that starts with `stop`; records of the "entry" lines among them.
  /// Fails the test when the child ends or goes quiet for 20 s first, or prints an "error" line.
  std::vector<shm_record> records_until(const std::string& stop, std::string* stop_line = nullptr)
  {
    std::vector<shm_record> r;
    for (;;) {
      const auto l = line();
      if (!l) {
        ADD_FAILURE() << "child " << pid_ << ": no '" << stop << "' line";
        return r;
      }
      if (l->rfind(stop, 0) == 0) {
        if (stop_line != nullptr) { *stop_line = *l; }
        return r;
      }
      if (l->rfind("error", 0) == 0) { ADD_FAILURE() << "child " << pid_ << ": " << *l; }
      if (l->rfind("entry ", 0) == 0) {
        std::istringstream in{l->substr(6)};
        shm_record x{};
        in >> x.index >> x.hook >> x.seq >> x.forward >> x.tag >> x.size >> x.status >> x.bytes_ok;
        r.push_back(x);
      }
    }
  }
  /// Waits for a line starting with `what`; the line.
  std::string expect_line(const std::string& what)
  {
    std::string l;
    (void)records_until(what, &l);
    return l;
  }

  /// SIGKILL, then reaped (no zombie: the stream sees the pid gone).
  void kill()
  {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      ::waitpid(pid_, &st, 0);
      pid_ = -1;
    }
  }
  /// Its exit status once it ended by itself (-1: still running after `timeout`).
  int wait(std::chrono::milliseconds timeout = std::chrono::seconds(20))
  {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (pid_ > 0) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      if (std::chrono::steady_clock::now() >= end) { return -1; }
      ::usleep(1000);
    }
    return -1;
  }

 private:
  pid_t pid_{-1};
  int out_{-1};
  std::string buf_;
};

}  // namespace ferry::test
