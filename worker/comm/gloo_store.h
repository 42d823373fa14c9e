// Adapts a RendezvousStore to gloo::rendezvous::Store (which reports failures by throwing
// gloo::IoException, as Gloo's rendezvous expects). Internal to the Gloo backend; torch-free.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "gloo/rendezvous/store.h"
#include "worker/comm/rendezvous_store.h"

namespace qlora::comm {

class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  // Keys are prefixed with `prefix` + "/gloo/". `timeout` bounds get() and wait() without one.
  GlooStoreAdapter(RendezvousStore& store, std::string prefix, std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::string Key(const std::string& key) const;

  RendezvousStore& store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

}  // namespace qlora::comm
