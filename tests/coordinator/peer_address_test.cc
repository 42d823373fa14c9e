// PeerHost: where a worker's call came from, as shown in the job's events.
#include "coordinator/jobs/peer_address.h"

#include "gtest/gtest.h"

namespace qlora::coordinator {
namespace {

TEST(CoordinatorPeerAddressTest, HostOfEachPeerForm) {
  EXPECT_EQ(PeerHost("ipv4:10.77.0.2:41234"), "10.77.0.2");
  EXPECT_EQ(PeerHost("ipv6:[fd00::2]:41234"), "fd00::2");
  EXPECT_EQ(PeerHost("ipv6:%5B::1%5D:1"), "%5B::1%5D:1");  // not the bracketed form: shown as is
  EXPECT_EQ(PeerHost("unix:/run/qlora.sock"), "local");
  EXPECT_EQ(PeerHost("something-else"), "something-else");
  EXPECT_EQ(PeerHost(""), "");
}

}  // namespace
}  // namespace qlora::coordinator
