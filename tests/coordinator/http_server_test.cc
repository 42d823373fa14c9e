// The HTTP port's server (coordinator/http/http_server.h) on real sockets on 127.0.0.x, and its
// request-head parser: what a hostile or slow client gets, and that it cannot starve others.
// Through a real coordinator: tests/service/status_page_test.cc.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/http/http_request_head.h"
#include "coordinator/http/http_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace qlora::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using Clock = std::chrono::steady_clock;

// A TCP connection to 127.0.0.1:`port` made from 127.0.0.`from` (every 127/8 address is the
// loopback interface's on Linux), so that tests can play several clients.
int Connect(int port, int from = 1) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  local.sin_addr.s_addr = htonl(0x7f000000u | static_cast<uint32_t>(from));
  if (bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0) ADD_FAILURE() << "bind";
  sockaddr_in server{};
  server.sin_family = AF_INET;
  server.sin_port = htons(static_cast<uint16_t>(port));
  server.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&server), sizeof(server)) != 0) ADD_FAILURE() << "connect";
  return fd;
}

// Everything the server sends until it closes (or `timeout_ms` passes).
std::string ReadAll(int fd, int timeout_ms = 5000) {
  std::string out;
  const auto end = Clock::now() + std::chrono::milliseconds(timeout_ms);
  char buffer[65536];
  while (Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    const int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count());
    if (poll(&p, 1, std::max(left, 1)) <= 0) break;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  return out;
}

std::string Ask(int port, const std::string& request, int from = 1) {
  const int fd = Connect(port, from);
  (void)!send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string answer = ReadAll(fd);
  close(fd);
  return answer;
}

std::string Get(int port, const std::string& path, int from = 1) {
  return Ask(port, absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"), from);
}

HttpServerResponse Echo(const HttpServerRequest& r) {
  HttpServerResponse response;
  response.body = absl::StrCat("path=", r.path, " query=", r.query, " host=", r.host, " auth=", r.authorization);
  return response;
}

std::unique_ptr<HttpServer> Serve(HttpServerOptions options, HttpServer::Handler handler = Echo) {
  options.address = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(options, std::move(handler));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

TEST(HttpRequestHeadTest, ReadsWhatTheHandlerNeeds) {
  const std::string head =
      "GET /jobs/a%20b?x=1&y=%41 HTTP/1.1\r\nhost:  example:9\r\nAUTHORIZATION: Bearer t\r\nX-Other: 1\r\n\r\n";
  ASSERT_EQ(HttpRequestHeadEnd(head), head.size());
  absl::StatusOr<HttpServerRequest> r = ParseHttpRequestHead(head);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->method, "GET");
  EXPECT_EQ(r->path, "/jobs/a b");
  EXPECT_EQ(r->query, "x=1&y=%41");  // the query is the handler's to decode
  EXPECT_EQ(r->host, "example:9");
  EXPECT_EQ(r->authorization, "Bearer t");
  // Bare LF line ends, HTTP/1.0, no headers.
  ASSERT_TRUE(ParseHttpRequestHead("HEAD / HTTP/1.0\n\n").ok());
}

TEST(HttpRequestHeadTest, FindsTheEndOnlyOnceItArrived) {
  EXPECT_FALSE(HttpRequestHeadEnd("GET / HTTP/1.1\r\nHost: x\r\n"));
  EXPECT_FALSE(HttpRequestHeadEnd("GET / HTTP/1.1\r\nHost: x\r\n\r"));
  EXPECT_EQ(HttpRequestHeadEnd("GET / HTTP/1.1\r\n\r\nbody"), 18u);
  // Looking again from where an earlier, shorter look left off (less 3) finds the same end.
  EXPECT_EQ(HttpRequestHeadEnd("GET / HTTP/1.1\r\n\r\nbody", 14), 18u);
}

TEST(HttpRequestHeadTest, RefusesWhatIsAmbiguous) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"GET http://evil/ HTTP/1.1\r\n\r\n", "absolute path"},
      {"GET * HTTP/1.1\r\n\r\n", "absolute path"},
      {"GET / HTTP/2.0\r\n\r\n", "HTTP/1.0 or HTTP/1.1"},
      {"GET  / HTTP/1.1\r\n\r\n", "request line"},
      {"GET /\x01 HTTP/1.1\r\n\r\n", "absolute path"},
      {"G(T / HTTP/1.1\r\n\r\n", "method"},
      {"GET /%zz HTTP/1.1\r\n\r\n", "percent escape"},
      {"GET /a% HTTP/1.1\r\n\r\n", "percent escape"},
      {"GET /a%00b HTTP/1.1\r\n\r\n", "NUL"},
      {"GET /a%0d%0aSet-Cookie:%20x HTTP/1.1\r\n\r\n", "control character"},
      {"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", "folded"},
      {"GET / HTTP/1.1\r\nNo colon\r\n\r\n", "malformed header"},
      {"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n", "malformed header"},
      {"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "Host"},
      {"GET / HTTP/1.1\r\nAuthorization: a\r\nauthorization: b\r\n\r\n", "Authorization"},
      {"GET / HTTP/1.1\r\nX: a\x7f\r\n\r\n", "control character"},
  };
  for (const auto& [head, why] : bad) {
    absl::StatusOr<HttpServerRequest> r = ParseHttpRequestHead(head);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << head;
    EXPECT_THAT(r.status().message(), HasSubstr(why)) << head;
  }
  std::string many = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 65; ++i) absl::StrAppend(&many, "X", i, ": 1\r\n");
  EXPECT_THAT(ParseHttpRequestHead(many + "\r\n").status().message(), HasSubstr("too many"));
}

TEST(HttpServerTest, AnswersGetAndHeadAndRefusesTheRest) {
  auto server = Serve({});
  ASSERT_NE(server, nullptr);
  const std::string get = Ask(server->port(), "GET /p?q HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer x\r\n\r\n");
  EXPECT_THAT(get, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(get, HasSubstr("Cache-Control: no-store\r\n"));
  EXPECT_THAT(get, HasSubstr("X-Content-Type-Options: nosniff\r\n"));
  EXPECT_THAT(get, HasSubstr("Connection: close\r\n"));
  EXPECT_TRUE(absl::EndsWith(get, "\r\n\r\npath=/p query=q host=h auth=Bearer x")) << get;

  const std::string head = Ask(server->port(), "HEAD /p HTTP/1.1\r\n\r\n");
  EXPECT_THAT(head, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(head, HasSubstr("Content-Length: 26\r\n"));  // the GET's length, no body
  EXPECT_TRUE(absl::EndsWith(head, "\r\n\r\n")) << head;

  const std::string post = Ask(server->port(), "POST /p HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc");
  EXPECT_THAT(post, StartsWith("HTTP/1.1 405 "));
  EXPECT_THAT(post, HasSubstr("Allow: GET, HEAD\r\n"));
  EXPECT_THAT(Ask(server->port(), "hello\r\n\r\n"), StartsWith("HTTP/1.1 400 "));
  EXPECT_THAT(Ask(server->port(), "GET /%00 HTTP/1.1\r\n\r\n"), HasSubstr("NUL"));
}

TEST(HttpServerTest, AnOverlongHeadIsAnswered431) {
  auto server = Serve({.max_request_bytes = 1024});
  ASSERT_NE(server, nullptr);
  const std::string answer =
      Ask(server->port(), absl::StrCat("GET / HTTP/1.1\r\nX-Pad: ", std::string(4000, 'a'), "\r\n\r\n"));
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 431 "));
}

TEST(HttpServerTest, AHeadNotSentInTimeIsDropped) {
  auto server = Serve({.request_timeout_ms = 300});
  ASSERT_NE(server, nullptr);
  const int fd = Connect(server->port());
  (void)!send(fd, "GET / HTTP/1.1\r\n", 16, MSG_NOSIGNAL);
  const auto begin = Clock::now();
  EXPECT_EQ(ReadAll(fd, 3000), "");  // closed without an answer
  const double waited = std::chrono::duration<double>(Clock::now() - begin).count();
  EXPECT_GT(waited, 0.2);
  EXPECT_LT(waited, 2.0);
  close(fd);
}

// True when the server has closed `fd` (end of stream or reset) within `timeout_ms`.
bool ClosedByServer(int fd, int timeout_ms = 200) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return false;
  char byte;
  return recv(fd, &byte, 1, MSG_DONTWAIT) <= 0;
}

// A handler that holds requests for /slow until released (`holding` counts them).
struct Gate {
  std::mutex mutex;
  std::condition_variable opened;
  bool open = false;
  std::atomic<int> holding{0};
  HttpServer::Handler Handler() {
    return [this](const HttpServerRequest& r) {
      if (r.path == "/slow") {
        ++holding;
        std::unique_lock<std::mutex> lock(mutex);
        opened.wait(lock, [&] { return open; });
      }
      return Echo(r);
    };
  }
  void Open() {
    { std::lock_guard<std::mutex> lock(mutex); open = true; }
    opened.notify_all();
  }
  bool WaitHolding(int n) {
    for (int i = 0; i < 200 && holding.load() < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return holding.load() >= n;
  }
};

int SendOnly(int port, const std::string& path, int from) {
  const int fd = Connect(port, from);
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.1\r\n\r\n");
  (void)!send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  return fd;
}

// Idle connections hold no slot against a real request: at an address's cap, the oldest
// connection still waiting for its head is dropped and the newcomer served, so a local user's
// idle sockets cannot lock out Prometheus or a browser on the same 127.0.0.1.
TEST(HttpServerTest, IdleConnectionsGiveWayToRequests) {
  auto server = Serve({.request_timeout_ms = 10000, .max_connections_per_client = 4});
  ASSERT_NE(server, nullptr);
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(Connect(server->port(), 2));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // accepted
  const auto begin = Clock::now();
  EXPECT_THAT(Get(server->port(), "/", 2), StartsWith("HTTP/1.1 200 "));
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - begin).count(), 1.0);
  EXPECT_TRUE(ClosedByServer(idle[0])) << "the oldest idle connection gave way";
  for (size_t i = 1; i < idle.size(); ++i) EXPECT_FALSE(ClosedByServer(idle[i], 20)) << i;
  for (int fd : idle) close(fd);
}

// Connections whose requests are being served do hold their slots: one more from that address
// is answered 503 at once, while another address is served.
TEST(HttpServerTest, CapsBusyConnectionsPerClient) {
  Gate gate;
  auto server = Serve({.request_timeout_ms = 10000, .max_connections_per_client = 2}, gate.Handler());
  ASSERT_NE(server, nullptr);
  std::vector<int> busy = {SendOnly(server->port(), "/slow", 2), SendOnly(server->port(), "/slow", 2)};
  ASSERT_TRUE(gate.WaitHolding(2));
  const auto begin = Clock::now();
  const std::string refused = Get(server->port(), "/", 2);
  EXPECT_THAT(refused, StartsWith("HTTP/1.1 503 "));
  EXPECT_THAT(refused, HasSubstr("Retry-After: 1\r\n"));
  EXPECT_THAT(refused, HasSubstr("too many connections from this address"));
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - begin).count(), 1.0);
  EXPECT_THAT(Get(server->port(), "/other", 3), StartsWith("HTTP/1.1 200 "));
  gate.Open();
  for (int fd : busy) {
    EXPECT_THAT(ReadAll(fd), StartsWith("HTTP/1.1 200 "));
    close(fd);
  }
  EXPECT_THAT(Get(server->port(), "/", 2), StartsWith("HTTP/1.1 200 "));
}

TEST(HttpServerTest, CapsConnectionsInAll) {
  Gate gate;
  auto server = Serve({.request_timeout_ms = 10000, .max_connections = 3}, gate.Handler());
  ASSERT_NE(server, nullptr);
  // Idle ones give way, the address holding most first...
  std::vector<int> idle = {Connect(server->port(), 10), Connect(server->port(), 11), Connect(server->port(), 11)};
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_THAT(Get(server->port(), "/", 20), StartsWith("HTTP/1.1 200 "));
  EXPECT_FALSE(ClosedByServer(idle[0], 20));
  EXPECT_TRUE(ClosedByServer(idle[1]));
  for (int fd : idle) close(fd);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // ... busy ones do not.
  std::vector<int> busy;
  for (int i = 0; i < 3; ++i) busy.push_back(SendOnly(server->port(), "/slow", 10 + i));
  ASSERT_TRUE(gate.WaitHolding(3));
  const std::string refused = Get(server->port(), "/", 20);
  EXPECT_THAT(refused, StartsWith("HTTP/1.1 503 "));
  EXPECT_THAT(refused, HasSubstr("too many connections\n"));
  gate.Open();
  for (int fd : busy) close(fd);
}

// A handler that throws answers 500 and the server goes on; a request that waited in the queue
// longer than the request deadline is answered 503 without running the handler.
TEST(HttpServerTest, AThrowingHandlerAnswers500AndALongWait503) {
  auto server = Serve({.handler_threads = 1, .request_timeout_ms = 300}, [](const HttpServerRequest& r) {
    if (r.path == "/throw") throw std::runtime_error("boom");
    if (r.path == "/slow") std::this_thread::sleep_for(std::chrono::milliseconds(700));
    return Echo(r);
  });
  ASSERT_NE(server, nullptr);
  EXPECT_THAT(Get(server->port(), "/throw"), StartsWith("HTTP/1.1 500 "));
  EXPECT_THAT(Get(server->port(), "/"), StartsWith("HTTP/1.1 200 "));
  const int slow = SendOnly(server->port(), "/slow", 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const std::string waited = Get(server->port(), "/", 5);
  EXPECT_THAT(waited, StartsWith("HTTP/1.1 503 "));
  EXPECT_THAT(waited, HasSubstr("busy"));
  EXPECT_THAT(ReadAll(slow), StartsWith("HTTP/1.1 200 "));
  close(slow);
}

// An answer to a request whose body was never read still arrives whole (the server reads and
// drops the rest before closing instead of resetting the connection).
TEST(HttpServerTest, AnAnswerSurvivesAnUnreadBody) {
  auto server = Serve({});
  ASSERT_NE(server, nullptr);
  const int fd = Connect(server->port());
  std::thread sender([fd] {
    const std::string head = "POST /api/jobs HTTP/1.1\r\nContent-Length: 1048576\r\n\r\n";
    (void)!send(fd, head.data(), head.size(), MSG_NOSIGNAL);
    const std::string chunk(65536, 'x');
    for (int i = 0; i < 16; ++i) (void)!send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL);
    shutdown(fd, SHUT_WR);
  });
  const std::string answer = ReadAll(fd);
  sender.join();
  close(fd);
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 405 "));
  EXPECT_TRUE(absl::EndsWith(answer, "read-only: only GET and HEAD\n")) << answer;
}

// An address that resolves to several listens on each, on one port ("localhost" may be ::1 and
// 127.0.0.1; here no host at all: every IPv4 and every IPv6 interface).
TEST(HttpServerTest, ListensOnEveryAddressItResolvesTo) {
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start({.address = ":0"}, Echo);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT(Get((*server)->port(), "/v4"), StartsWith("HTTP/1.1 200 "));
  const int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in6 v6{};
  v6.sin6_family = AF_INET6;
  v6.sin6_port = htons(static_cast<uint16_t>((*server)->port()));
  v6.sin6_addr = in6addr_loopback;
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&v6), sizeof(v6)) != 0) {
    if (fd >= 0) close(fd);
    GTEST_SKIP() << "no IPv6 loopback here";
  }
  (void)!send(fd, "GET /v6 HTTP/1.1\r\n\r\n", 20, MSG_NOSIGNAL);
  EXPECT_THAT(ReadAll(fd), StartsWith("HTTP/1.1 200 "));
  close(fd);
}

// Slow clients hold no thread: 200 connections trickling a byte at a time from 20 addresses,
// and a client that never reads its 16 MB answer, leave the one handler thread free for others.
TEST(HttpServerTest, SlowClientsHoldNoThread) {
  HttpServerOptions options;
  options.handler_threads = 1;
  options.request_timeout_ms = 10000;
  options.write_timeout_ms = 10000;
  auto server = Serve(options, [](const HttpServerRequest& r) {
    HttpServerResponse response;
    if (r.path == "/big") response.body.assign(16 << 20, 'b');
    else response.body = "small";
    return response;
  });
  ASSERT_NE(server, nullptr);
  const int hog = Connect(server->port(), 30);
  (void)!send(hog, "GET /big HTTP/1.1\r\n\r\n", 21, MSG_NOSIGNAL);  // and never read
  std::vector<int> slow;
  for (int i = 0; i < 200; ++i) {
    slow.push_back(Connect(server->port(), 40 + i % 20));
    (void)!send(slow.back(), "GET / HTTP/1.1\r\n", 16, MSG_NOSIGNAL);
  }
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    while (!stop.load()) {
      for (int fd : slow) (void)!send(fd, "X", 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  for (int i = 0; i < 5; ++i) {
    const auto begin = Clock::now();
    const std::string answer = Get(server->port(), "/", 3);
    EXPECT_TRUE(absl::EndsWith(answer, "\r\n\r\nsmall")) << answer.substr(0, 200);
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - begin).count(), 0.5) << "request " << i;
  }
  stop.store(true);
  trickle.join();
  for (int fd : slow) close(fd);
  close(hog);
}

TEST(HttpServerTest, RefusesAnAddressItCannotUse) {
  EXPECT_EQ(HttpServer::Start({.address = "127.0.0.1:99999"}, Echo).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpServer::Start({.address = "nonsense"}, Echo).status().code(), absl::StatusCode::kInvalidArgument);
  auto first = Serve({});
  ASSERT_NE(first, nullptr);
  absl::StatusOr<std::unique_ptr<HttpServer>> taken =
      HttpServer::Start({.address = absl::StrCat("127.0.0.1:", first->port())}, Echo);
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(taken.status().message(), HasSubstr("cannot listen on 127.0.0.1:"));
}

}  // namespace
}  // namespace qlora::coordinator
