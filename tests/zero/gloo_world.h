// Test helper: runs one function per rank on threads of this process, each rank with its own
// Gloo communicator over one shared InMemoryRendezvousStore (a real TCP mesh on loopback).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/in_memory_store.h"

namespace qlora::testing {

// Returns each rank's status: the connect error, or what `body` returned.
inline std::vector<absl::Status> RunGlooWorld(
    int world, const std::function<absl::Status(int rank, comm::Communicator&)>& body) {
  static std::atomic<int> generation{0};
  auto store = std::make_shared<comm::InMemoryRendezvousStore>();
  const std::string prefix = absl::StrCat("test/gen-", generation++);
  std::vector<absl::Status> results(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      comm::GlooOptions options;
      options.rank = rank;
      options.world_size = world;
      options.prefix = prefix;
      options.connect_timeout = absl::Seconds(30);
      auto communicator = comm::ConnectGloo(options, store);
      results[rank] = communicator.ok() ? body(rank, **communicator) : communicator.status();
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

}  // namespace qlora::testing
