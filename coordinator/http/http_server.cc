// The read-only HTTP server: one epoll thread for every socket, a few threads for the handler
// (see http_server.h).
//
// A connection moves through four states: kReading (its head arriving, under the request
// deadline), kHandling (off epoll, queued to or inside a handler thread), kWriting (its answer
// going out, under the write deadline), kDraining (answer sent and our side shut: what the
// client still sends is read and dropped for a moment, since closing with unread input makes
// the kernel reset the connection and throw away an answer still in flight). Connections are
// named by a serial number, never by their descriptor, so an answer for a connection that has
// meanwhile been closed is dropped rather than sent to a descriptor reused by someone else.
//
// At a cap, a connection that is still only reading its head (idle or slow: a real client sends
// its head at once) is dropped to make room, the oldest of the address, or at the total cap of
// the address holding most; only when there is none is the newcomer refused. So idle sockets
// cannot lock others of the same address (every local client shares 127.0.0.1) out.
#include "coordinator/http/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace qlora::coordinator {
namespace {

using Clock = std::chrono::steady_clock;

// Epoll data of the descriptors that are not connections: the wake-up, then the listening
// sockets (one per address a name resolves to); connection serials start above them.
constexpr uint64_t kWakeTag = 0;
constexpr uint64_t kFirstListenTag = 1;
constexpr uint64_t kMaxListeners = 8;
constexpr uint64_t kFirstSerial = kFirstListenTag + kMaxListeners;
// How long a connection whose answer is sent keeps reading what the client still sends.
constexpr auto kDrainTime = std::chrono::milliseconds(1000);
// A pause in accepting after the process ran out of descriptors, instead of spinning on accept.
constexpr auto kAcceptPause = std::chrono::milliseconds(100);

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 421: return "Misdirected Request";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return status < 400 ? "OK" : "Error";
  }
}

std::string Render(const HttpServerResponse& response, bool head) {
  std::string out = absl::StrCat("HTTP/1.1 ", response.status, " ", Reason(response.status), "\r\n",
                                 "Content-Type: ", response.content_type, "\r\n",
                                 "Content-Length: ", response.body.size(), "\r\n",
                                 "Cache-Control: no-store\r\n"
                                 "X-Content-Type-Options: nosniff\r\n"
                                 "X-Frame-Options: DENY\r\n"
                                 "Referrer-Policy: no-referrer\r\n"
                                 "Connection: close\r\n");
  for (const auto& [name, value] : response.headers) absl::StrAppend(&out, name, ": ", value, "\r\n");
  out += "\r\n";
  if (!head) out += response.body;
  return out;
}

std::string Plain(int status, std::string body, std::vector<std::pair<std::string, std::string>> headers = {}) {
  HttpServerResponse response;
  response.status = status;
  response.body = std::move(body);
  response.headers = std::move(headers);
  return Render(response, /*head=*/false);
}

// The client a connection counts against: its IPv4 address (also when it arrives IPv4-mapped
// on an IPv6 socket), or its IPv6 /64 (one host commonly holds a whole /64).
std::string ClientOf(const sockaddr_storage& peer) {
  char text[INET6_ADDRSTRLEN] = "";
  if (peer.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(peer).sin_addr, text, sizeof(text));
    return text;
  }
  if (peer.ss_family != AF_INET6) return "";
  in6_addr address = reinterpret_cast<const sockaddr_in6&>(peer).sin6_addr;
  if (IN6_IS_ADDR_V4MAPPED(&address)) {
    in_addr v4;
    memcpy(&v4, &address.s6_addr[12], sizeof(v4));
    inet_ntop(AF_INET, &v4, text, sizeof(text));
    return text;
  }
  memset(&address.s6_addr[8], 0, 8);
  inet_ntop(AF_INET6, &address, text, sizeof(text));
  return absl::StrCat(text, "/64");
}

// Reads and drops what is waiting on a socket (without blocking).
void DrainInput(int fd) {
  char buffer[4096];
  while (recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT) > 0) {
  }
}

// Closes at once with a reset: for a peer past its deadline, whose unread answer would otherwise
// keep kernel memory for minutes while the kernel probes its closed window.
void Abort(int fd) {
  const linger now{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &now, sizeof(now));
  close(fd);
}

// The port of an IPv4 or IPv6 socket address.
uint16_t& PortOf(sockaddr_storage& address) {
  return address.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(address).sin6_port
                                       : reinterpret_cast<sockaddr_in&>(address).sin_port;
}

struct Listening {
  std::vector<int> fds;
  int port = 0;
};

// Listening sockets for "host:port", "[v6]:port" or ":port"/"port" (every interface): one for
// each address the host resolves to ("localhost": ::1 and 127.0.0.1), all on one port.
absl::StatusOr<Listening> Listen(const std::string& address) {
  std::string host;
  std::string port;
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return absl::InvalidArgumentError(absl::StrCat("cannot read address '", address, "'"));
    }
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else if (const size_t colon = address.rfind(':'); colon != std::string::npos) {
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  } else {
    port = address;
  }
  int port_number = 0;
  if (!absl::SimpleAtoi(port, &port_number) || port_number < 0 || port_number > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read the port of '", address, "'"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int resolved = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
  if (resolved != 0 || found == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot resolve '", address, "': ", gai_strerror(resolved)));
  }
  Listening out;
  out.port = port_number;
  for (addrinfo* a = found; a != nullptr && out.fds.size() < kMaxListeners; a = a->ai_next) {
    sockaddr_storage where{};
    memcpy(&where, a->ai_addr, a->ai_addrlen);
    PortOf(where) = htons(static_cast<uint16_t>(out.port));  // the first one's, when 0 asked for any
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    const int one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    // An IPv6 socket takes IPv6 alone, so that "::" and "0.0.0.0" from one name can both listen.
    if (fd >= 0 && a->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&where), a->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
      const std::string why = strerror(errno);
      if (fd >= 0) close(fd);
      for (int open : out.fds) close(open);
      freeaddrinfo(found);
      return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", why));
    }
    if (out.port == 0) {
      sockaddr_storage got{};
      socklen_t length = sizeof(got);
      getsockname(fd, reinterpret_cast<sockaddr*>(&got), &length);
      out.port = ntohs(PortOf(got));
    }
    out.fds.push_back(fd);
  }
  freeaddrinfo(found);
  if (out.fds.empty()) return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": no address"));
  return out;
}

}  // namespace

struct HttpServer::Loop {
  enum class State { kReading, kHandling, kWriting, kDraining };
  struct Connection {
    int fd = -1;
    std::string client;
    State state = State::kReading;
    Clock::time_point deadline;
    std::string received;
    std::string answer;
    size_t sent = 0;
  };
  struct Job {
    uint64_t serial;
    HttpServerRequest request;
    Clock::time_point queued;
  };

  HttpServerOptions options;
  Handler handler;
  std::vector<int> listen_fds;
  int epoll_fd = -1;
  int wake_fd = -1;
  int port = 0;

  // Owned by the loop thread alone.
  std::map<uint64_t, Connection> connections;  // by serial: oldest first
  std::map<std::string, int> per_client;
  uint64_t next_serial = kFirstSerial;
  bool accepting = true;
  Clock::time_point resume_accepting;

  // Shared with the handler threads.
  std::mutex mutex;
  std::condition_variable work;
  std::deque<Job> jobs;
  std::deque<std::pair<uint64_t, std::string>> answers;
  bool stopping = false;
  std::atomic<bool> stop_loop{false};

  std::thread loop_thread;
  std::vector<std::thread> handler_threads;

  ~Loop() {
    stop_loop.store(true);
    Wake();
    if (loop_thread.joinable()) loop_thread.join();
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    work.notify_all();
    for (std::thread& t : handler_threads) t.join();
    for (auto& [serial, c] : connections) close(c.fd);
    for (int fd : listen_fds) close(fd);
    if (epoll_fd >= 0) close(epoll_fd);
    if (wake_fd >= 0) close(wake_fd);
  }

  void Wake() const {
    const uint64_t one = 1;
    if (wake_fd >= 0) (void)!write(wake_fd, &one, sizeof(one));
  }

  void Watch(int fd, uint32_t events, uint64_t tag, int op) const {
    epoll_event event{};
    event.events = events;
    event.data.u64 = tag;
    epoll_ctl(epoll_fd, op, fd, &event);
  }

  void WatchListeners(uint32_t events, int op) const {
    for (size_t i = 0; i < listen_fds.size(); ++i) Watch(listen_fds[i], events, kFirstListenTag + i, op);
  }

  void Close(uint64_t serial, bool abort = false) {
    auto it = connections.find(serial);
    if (it == connections.end()) return;
    if (abort) {
      Abort(it->second.fd);  // also leaves epoll
    } else {
      close(it->second.fd);
    }
    if (--per_client[it->second.client] == 0) per_client.erase(it->second.client);
    connections.erase(it);
  }

  // Starts sending `answer` on a connection; it is closed once sent or on its deadline.
  void Answer(uint64_t serial, std::string answer) {
    auto it = connections.find(serial);
    if (it == connections.end()) return;
    Connection& c = it->second;
    const bool was_watched = c.state == State::kReading;
    c.state = State::kWriting;
    c.answer = std::move(answer);
    c.sent = 0;
    c.received.clear();
    c.deadline = Clock::now() + std::chrono::milliseconds(options.write_timeout_ms);
    Watch(c.fd, EPOLLOUT, serial, was_watched ? EPOLL_CTL_MOD : EPOLL_CTL_ADD);
    Write(serial);
  }

  // Accepted beyond a cap: a short 503 if the socket takes it now, then closed.
  static void Refuse(int fd, const char* why) {
    const std::string answer = Plain(503, absl::StrCat(why, "\n"), {{"Retry-After", "1"}});
    DrainInput(fd);
    (void)!send(fd, answer.data(), answer.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    shutdown(fd, SHUT_WR);
    close(fd);
  }

  // Drops the oldest connection of `client` (any client: "") that is still reading its head.
  bool DropOldestReading(const std::string& client) {
    for (const auto& [serial, c] : connections) {
      if (c.state == State::kReading && (client.empty() || c.client == client)) {
        Close(serial, /*abort=*/true);
        return true;
      }
    }
    return false;
  }

  // Room for one more connection from `client`: true when it is within the caps, or was brought
  // within them by dropping a connection that is still reading its head.
  bool MakeRoom(const std::string& client) {
    const auto held = per_client.find(client);
    if (held != per_client.end() && held->second >= options.max_connections_per_client &&
        !DropOldestReading(client)) {
      return false;
    }
    if (connections.size() < static_cast<size_t>(options.max_connections)) return true;
    // At the total cap: a reading connection of the address holding most, else of anyone.
    std::string most;
    int most_held = 0;
    for (const auto& [name, count] : per_client) {
      if (count > most_held) most = name, most_held = count;
    }
    return DropOldestReading(most) || DropOldestReading("");
  }

  void Accept(int listen_fd) {
    while (accepting) {
      sockaddr_storage peer{};
      socklen_t length = sizeof(peer);
      const int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer), &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          accepting = false;
          resume_accepting = Clock::now() + kAcceptPause;
          WatchListeners(0, EPOLL_CTL_MOD);
        }
        return;  // EAGAIN, or a connection that went away before we took it
      }
      const std::string client = ClientOf(peer);
      if (!MakeRoom(client)) {
        Refuse(fd, connections.size() >= static_cast<size_t>(options.max_connections)
                       ? "too many connections"
                       : "too many connections from this address");
        continue;
      }
      ++per_client[client];
      const uint64_t serial = next_serial++;
      Connection& c = connections[serial];
      c.fd = fd;
      c.client = client;
      c.deadline = Clock::now() + std::chrono::milliseconds(options.request_timeout_ms);
      Watch(fd, EPOLLIN | EPOLLRDHUP, serial, EPOLL_CTL_ADD);
    }
  }

  void Read(uint64_t serial) {
    Connection& c = connections.at(serial);
    char buffer[4096];
    while (true) {
      const ssize_t n = recv(c.fd, buffer, sizeof(buffer), 0);
      if (n == 0) return Close(serial);  // gone before its request was whole
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR) continue;
        return Close(serial);
      }
      // The blank line may straddle what came before: look again from just before it.
      const size_t from = c.received.size() < 3 ? 0 : c.received.size() - 3;
      c.received.append(buffer, static_cast<size_t>(n));
      const std::optional<size_t> end = HttpRequestHeadEnd(c.received, from);
      if (!end && c.received.size() <= options.max_request_bytes) continue;
      if (!end || *end > options.max_request_bytes) {
        return Answer(serial, Plain(431, "the request head is too long\n"));
      }
      absl::StatusOr<HttpServerRequest> request =
          ParseHttpRequestHead(absl::string_view(c.received).substr(0, *end));
      if (!request.ok()) return Answer(serial, Plain(400, absl::StrCat(request.status().message(), "\n")));
      if (request->method != "GET" && request->method != "HEAD") {
        return Answer(serial, Plain(405, "read-only: only GET and HEAD\n", {{"Allow", "GET, HEAD"}}));
      }
      c.state = State::kHandling;
      epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c.fd, nullptr);
      {
        std::lock_guard<std::mutex> lock(mutex);
        jobs.push_back({serial, *std::move(request), Clock::now()});
      }
      work.notify_one();
      return;
    }
  }

  void Write(uint64_t serial) {
    Connection& c = connections.at(serial);
    while (c.sent < c.answer.size()) {
      const ssize_t n = send(c.fd, c.answer.data() + c.sent, c.answer.size() - c.sent, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR) continue;
        return Close(serial);
      }
      c.sent += static_cast<size_t>(n);
    }
    shutdown(c.fd, SHUT_WR);
    c.state = State::kDraining;
    c.answer.clear();
    c.deadline = Clock::now() + kDrainTime;
    Watch(c.fd, EPOLLIN | EPOLLRDHUP, serial, EPOLL_CTL_MOD);
    Drain(serial);
  }

  // Reads and drops what the client still sends; closes at its end of the stream.
  void Drain(uint64_t serial) {
    Connection& c = connections.at(serial);
    char buffer[4096];
    while (true) {
      const ssize_t n = recv(c.fd, buffer, sizeof(buffer), 0);
      if (n > 0) continue;
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      return Close(serial);  // the client closed too, or the connection failed
    }
  }

  void TakeAnswers() {
    uint64_t count = 0;
    (void)!read(wake_fd, &count, sizeof(count));
    std::deque<std::pair<uint64_t, std::string>> ready;
    {
      std::lock_guard<std::mutex> lock(mutex);
      ready.swap(answers);
    }
    for (auto& [serial, answer] : ready) Answer(serial, std::move(answer));
  }

  // Drops every connection whose deadline has passed; returns how long until the next one.
  int ExpireAndTimeout() {
    const Clock::time_point now = Clock::now();
    Clock::time_point next = now + std::chrono::seconds(1);
    std::vector<std::pair<uint64_t, bool>> expired;  // and whether to abort
    for (const auto& [serial, c] : connections) {
      if (c.state == State::kHandling) continue;
      if (c.deadline <= now) {
        expired.emplace_back(serial, c.state == State::kWriting);
      } else {
        next = std::min(next, c.deadline);
      }
    }
    for (const auto& [serial, abort] : expired) Close(serial, abort);
    if (!accepting) {
      if (resume_accepting <= now) {
        accepting = true;
        WatchListeners(EPOLLIN, EPOLL_CTL_MOD);
      } else {
        next = std::min(next, resume_accepting);
      }
    }
    return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(next - now).count());
  }

  void RunLoop() {
    epoll_event events[64];
    while (!stop_loop.load()) {
      const int n = epoll_wait(epoll_fd, events, 64, ExpireAndTimeout());
      for (int i = 0; i < n; ++i) {
        const uint64_t tag = events[i].data.u64;
        if (tag == kWakeTag) {
          TakeAnswers();
        } else if (tag < kFirstSerial) {
          Accept(listen_fds[tag - kFirstListenTag]);
        } else if (auto it = connections.find(tag); it != connections.end()) {
          switch (it->second.state) {
            case State::kReading: Read(tag); break;
            case State::kWriting: Write(tag); break;
            case State::kDraining: Drain(tag); break;
            case State::kHandling: break;  // off epoll
          }
        }
      }
    }
  }

  void RunHandler() {
    while (true) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mutex);
        work.wait(lock, [&] { return stopping || !jobs.empty(); });
        if (stopping) return;
        job = std::move(jobs.front());
        jobs.pop_front();
      }
      std::string answer;
      if (Clock::now() - job.queued > std::chrono::milliseconds(options.request_timeout_ms)) {
        // Waited too long behind others: the client has likely given up, and serving it would
        // only keep the queue long.
        answer = Plain(503, "busy\n", {{"Retry-After", "1"}});
      } else {
        HttpServerResponse response;
        try {
          response = handler(job.request);
        } catch (const std::exception&) {  // one bad request must not end the coordinator
          response = HttpServerResponse{};
          response.status = 500;
          response.body = "internal error\n";
        }
        answer = Render(response, job.request.method == "HEAD");
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        answers.emplace_back(job.serial, std::move(answer));
      }
      Wake();
    }
  }
};

HttpServer::HttpServer(std::unique_ptr<Loop> loop) : loop_(std::move(loop)) {}

HttpServer::~HttpServer() = default;

int HttpServer::port() const { return loop_->port; }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options, Handler handler) {
  if (options.handler_threads < 1 || options.max_connections < 1 || options.max_connections_per_client < 1 ||
      options.request_timeout_ms < 1 || options.write_timeout_ms < 1 || options.max_request_bytes < 64) {
    return absl::InvalidArgumentError("HTTP server limits must be positive");
  }
  auto loop = std::make_unique<Loop>();
  loop->options = options;
  loop->handler = std::move(handler);
  absl::StatusOr<Listening> listening = Listen(options.address);
  if (!listening.ok()) return listening.status();
  loop->listen_fds = std::move(listening->fds);
  loop->port = listening->port;
  loop->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  loop->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (loop->epoll_fd < 0 || loop->wake_fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve HTTP on ", options.address, ": ", strerror(errno)));
  }
  loop->WatchListeners(EPOLLIN, EPOLL_CTL_ADD);
  loop->Watch(loop->wake_fd, EPOLLIN, kWakeTag, EPOLL_CTL_ADD);
  Loop* raw = loop.get();
  for (int i = 0; i < options.handler_threads; ++i) loop->handler_threads.emplace_back([raw] { raw->RunHandler(); });
  loop->loop_thread = std::thread([raw] { raw->RunLoop(); });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(loop)));
}

}  // namespace qlora::coordinator
