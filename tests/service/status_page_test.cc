// The coordinator's HTTP port (--metrics-address) end to end: the real qlora-coordinator and
// workers on 127.0.0.1 train tiny CPU jobs while the test scrapes /metrics (parsing Prometheus'
// text format), reads the status page's JSON, checks that the port is read-only and follows the
// gRPC API's authentication, and loads the page in headless Chromium to see the job row and a
// drawn loss curve (a screenshot is kept under build/test-artifacts/).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/service_harness.h"
#include "tests/util/files.h"

namespace qlora::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

struct HttpAnswer {
  int status = 0;
  std::string head;  // status line and headers
  std::string body;
};

// One HTTP/1.1 request to 127.0.0.1:`port` (the server closes the connection after answering).
HttpAnswer Http(int port, const std::string& method, const std::string& target, const std::string& extra_headers = "") {
  HttpAnswer answer;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return answer;
  }
  const std::string host = absl::StrContains(extra_headers, "Host:") ? "" : "Host: 127.0.0.1\r\n";
  const std::string request = absl::StrCat(method, " ", target, " HTTP/1.1\r\n", host, extra_headers,
                                           "Connection: close\r\n\r\n");
  (void)!write(fd, request.data(), request.size());
  std::string data;
  char buffer[65536];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) data.append(buffer, static_cast<size_t>(n));
  close(fd);
  const size_t end = data.find("\r\n\r\n");
  if (end == std::string::npos) return answer;
  answer.head = data.substr(0, end);
  answer.body = data.substr(end + 4);
  absl::SimpleAtoi(answer.head.substr(9, 3), &answer.status);
  return answer;
}

std::string Bearer(const std::string& token) { return absl::StrCat("Authorization: Bearer ", token, "\r\n"); }

// One sample of the Prometheus text format.
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Parses the text format (version 0.0.4): comment lines, then `name{k="v",...} value`.
std::vector<Sample> ParseMetrics(const std::string& text) {
  static const std::regex kLine(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? ([^ ]+)$)");
  static const std::regex kLabel(R"re(([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)")re");
  std::vector<Sample> samples;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (line[0] == '#') continue;
    std::smatch m;
    const std::string s(line);
    if (!std::regex_match(s, m, kLine)) {
      ADD_FAILURE() << "not a sample line: " << s;
      continue;
    }
    Sample sample;
    sample.name = m[1];
    const std::string labels = m[3];
    for (auto it = std::sregex_iterator(labels.begin(), labels.end(), kLabel); it != std::sregex_iterator(); ++it) {
      sample.labels[(*it)[1]] = (*it)[2];
    }
    EXPECT_TRUE(absl::SimpleAtod(std::string(m[4]), &sample.value)) << s;
    samples.push_back(std::move(sample));
  }
  return samples;
}

// The value of the sample `name` whose labels include `labels`; nullopt when there is none.
std::optional<double> Value(const std::vector<Sample>& samples, const std::string& name,
                            const std::map<std::string, std::string>& labels = {}) {
  for (const Sample& s : samples) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      auto it = s.labels.find(k);
      if (it == s.labels.end() || it->second != v) match = false;
    }
    if (match) return s.value;
  }
  return std::nullopt;
}

class StatusPageTest : public ::testing::Test {
 protected:
  void SetUp() override { state_ = MakeTempDir("status-page"); }

  // A coordinator with one CPU slot serving the HTTP port on 127.0.0.1:0.
  std::unique_ptr<CoordinatorProcess> Start(const std::string& extra_flags = "") {
    const std::string port_file = state_ + "/s/metrics-port";
    auto c = std::make_unique<CoordinatorProcess>(
        state_ + "/s", 1, absl::StrCat("--metrics-address 127.0.0.1:0 --metrics-port-file ", port_file, " ", extra_flags));
    EXPECT_TRUE(c->started()) << ReadLog();
    std::ifstream in(port_file);
    in >> http_port_;
    EXPECT_GT(http_port_, 0) << ReadLog();
    return c;
  }

  std::vector<Sample> Scrape(const std::string& headers = "") {
    HttpAnswer a = Http(http_port_, "GET", "/metrics", headers);
    EXPECT_EQ(a.status, 200) << a.head << a.body;
    EXPECT_THAT(a.head, HasSubstr("text/plain; version=0.0.4"));
    return ParseMetrics(a.body);
  }

  std::string ReadLog() const { return ReadFile(state_ + "/s/coordinator.log"); }

  void Cancel(CoordinatorProcess& c, const std::string& id, const std::string& token = "") {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    v1::CancelJobRequest req;
    req.set_id(id);
    v1::Job job;
    EXPECT_TRUE(c.jobs()->CancelJob(&ctx, req, &job).ok());
  }

  std::string state_;
  int http_port_ = 0;
};

TEST_F(StatusPageTest, MetricsFollowTrainingJobsWorkerExitsAndRpcs) {
  auto c = Start();
  std::vector<Sample> idle = Scrape();
  EXPECT_EQ(Value(idle, "qlora_worker_slots", {{"kind", "cpu"}}), 1.0);
  EXPECT_EQ(Value(idle, "qlora_worker_slots_busy", {{"kind", "cpu"}}), 0.0);
  EXPECT_EQ(Value(idle, "qlora_jobs", {{"state", "queued"}}), 0.0);
  EXPECT_EQ(Value(idle, "qlora_queue_length"), 0.0);
  EXPECT_EQ(Value(idle, "qlora_worker_exits_total", {{"cause", "completed"}}), 0.0);

  // A long job holds the only slot; a second one waits in the queue.
  const std::string long_id = SubmitJob(*c, LongJob()).id();
  ASSERT_FALSE(long_id.empty());
  const std::string short_id = SubmitJob(*c, ShortJob()).id();
  ASSERT_FALSE(short_id.empty());
  // (A call is timed when its status is sent, just after its handler ran: the step can show a
  // moment before the call is counted.)
  const std::map<std::string, std::string> progress = {{"method", "/qlora.v1.WorkerService/ReportProgress"},
                                                       {"code", "OK"}};
  std::vector<Sample> m;
  ASSERT_TRUE(WaitUntil([&] {
    m = Scrape();
    return Value(m, "qlora_job_step", {{"job", long_id}}).value_or(0) >= 2 &&
           Value(m, "qlora_rpc_duration_seconds_count", progress).value_or(0) >= 2;
  }, 240)) << ReadLog();
  EXPECT_EQ(Value(m, "qlora_jobs", {{"state", "running"}}), 1.0);
  EXPECT_EQ(Value(m, "qlora_queue_length"), 1.0);
  EXPECT_EQ(Value(m, "qlora_jobs", {{"state", "queued"}}), 1.0);
  EXPECT_EQ(Value(m, "qlora_worker_slots_busy", {{"kind", "cpu"}}), 1.0);
  EXPECT_EQ(Value(m, "qlora_job_total_steps", {{"job", long_id}}), 100000.0);
  const double loss = Value(m, "qlora_job_loss", {{"job", long_id}}).value_or(-1);
  EXPECT_GT(loss, 0.0);
  EXPECT_GT(Value(m, "qlora_job_tokens_per_second", {{"job", long_id}}).value_or(0), 0.0);
  EXPECT_GT(Value(m, "qlora_job_learning_rate", {{"job", long_id}}).value_or(0), 0.0);
  EXPECT_GT(Value(m, "qlora_job_host_rss_bytes", {{"job", long_id}, {"rank", "0"}}).value_or(0), 0.0);
  const std::map<std::string, std::string> submit = {{"method", "/qlora.v1.JobService/SubmitJob"}, {"code", "OK"}};
  EXPECT_EQ(Value(m, "qlora_rpc_duration_seconds_count", submit), 2.0);
  const double reports = Value(m, "qlora_rpc_duration_seconds_count", progress).value_or(0);
  EXPECT_GE(reports, 2.0);
  EXPECT_TRUE(Value(m, "qlora_rpc_duration_seconds_bucket", {{"method", "/qlora.v1.JobService/SubmitJob"}, {"le", "+Inf"}}));

  // Values move while it trains.
  const double step = *Value(m, "qlora_job_step", {{"job", long_id}});
  ASSERT_TRUE(WaitUntil([&] {
    m = Scrape();
    return Value(m, "qlora_job_step", {{"job", long_id}}).value_or(0) > step &&
           Value(m, "qlora_rpc_duration_seconds_count", progress).value_or(0) > reports;
  }, 120));

  // The long job is cancelled, the short one runs to its end; ended jobs have no per-job series.
  Cancel(*c, long_id);
  c->WaitForState(short_id, {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 300);
  ASSERT_TRUE(WaitUntil([&] {
    m = Scrape();
    return Value(m, "qlora_worker_exits_total", {{"cause", "completed"}}).value_or(0) >= 1;
  }, 60)) << ReadLog();
  EXPECT_EQ(Value(m, "qlora_jobs", {{"state", "succeeded"}}), 1.0);
  EXPECT_EQ(Value(m, "qlora_jobs", {{"state", "cancelled"}}), 1.0);
  EXPECT_EQ(Value(m, "qlora_queue_length"), 0.0);
  EXPECT_FALSE(Value(m, "qlora_job_step", {{"job", long_id}}));
  const double stopped = Value(m, "qlora_worker_exits_total", {{"cause", "signal"}}).value_or(0) +
                         Value(m, "qlora_worker_exits_total", {{"cause", "exit_status"}}).value_or(0);
  EXPECT_EQ(stopped, 1.0) << "the cancelled job's worker";
  // A made-up method is never a label value of its own, so clients cannot grow the label set.
  grpc::GenericStub generic(c->channel());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1), response;
  absl::Notification called;
  grpc::Status status;
  generic.UnaryCall(&ctx, "/qlora.v1.JobService/MadeUp", grpc::StubOptions(), &request, &response,
                    [&](grpc::Status s) {
                      status = s;
                      called.Notify();
                    });
  ASSERT_TRUE(called.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  m = Scrape();
  for (Sample& s : m) EXPECT_NE(s.labels["method"], "/qlora.v1.JobService/MadeUp");
}

TEST_F(StatusPageTest, ApiServesJobsCurvesAndLogsReadOnly) {
  auto c = Start();
  TestTraining training = ShortTraining();
  training.eval_steps = 2;
  training.more_trainer = "eval_samples: 1";  // the page shows the latest samples
  const std::string id = SubmitJob(*c, TinyJobYaml(training)).id();
  ASSERT_FALSE(id.empty());
  v1::Job done = c->WaitForState(id, {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 300);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << ReadLog();

  HttpAnswer list = Http(http_port_, "GET", "/api/jobs");
  EXPECT_EQ(list.status, 200);
  EXPECT_THAT(list.head, HasSubstr("application/json"));
  EXPECT_THAT(list.body, HasSubstr(absl::StrCat("\"id\":\"", id, "\"")));
  EXPECT_THAT(list.body, HasSubstr("\"state\":\"succeeded\""));
  EXPECT_THAT(list.body, HasSubstr("\"total_steps\":4"));

  HttpAnswer job = Http(http_port_, "GET", absl::StrCat("/api/jobs/", id));
  EXPECT_EQ(job.status, 200);
  EXPECT_THAT(job.body, HasSubstr("\"points\":[{"));
  EXPECT_THAT(job.body, HasSubstr("\"step\":4"));
  EXPECT_THAT(job.body, HasSubstr("\"log_rank\":0"));
  EXPECT_THAT(job.body, Not(HasSubstr("\"log\":\"\"")));
  EXPECT_THAT(job.body, HasSubstr("\"samples\":{\"samples\":[{\"output\":"));
  EXPECT_THAT(job.body, HasSubstr("\"step\":4}"));
  // Only what follows a sequence number.
  const std::smatch last = [&] {
    std::smatch m;
    std::regex_search(job.body, m, std::regex(R"("last_sequence":(\d+))"));
    return m;
  }();
  ASSERT_FALSE(last.empty());
  HttpAnswer none = Http(http_port_, "GET", absl::StrCat("/api/jobs/", id, "?after=", last[1].str()));
  EXPECT_THAT(none.body, HasSubstr("\"points\":[]"));
  EXPECT_EQ(Http(http_port_, "GET", absl::StrCat("/api/jobs/", id, "?after=x")).status, 400);
  EXPECT_EQ(Http(http_port_, "GET", absl::StrCat("/api/jobs/", id, "?rank=7")).status, 400);
  EXPECT_EQ(Http(http_port_, "GET", "/api/jobs/job-999999").status, 404);

  // The pages: a shell with its own script and style sheet, nothing from elsewhere.
  HttpAnswer page = Http(http_port_, "GET", absl::StrCat("/jobs/", id));
  EXPECT_EQ(page.status, 200);
  EXPECT_THAT(page.head, HasSubstr("Content-Security-Policy: default-src 'none'; script-src 'self'"));
  EXPECT_THAT(page.body, HasSubstr("<script src=\"/static/status.js\""));
  EXPECT_THAT(page.body, Not(HasSubstr("http")));
  EXPECT_EQ(Http(http_port_, "GET", "/static/status.js").status, 200);
  EXPECT_EQ(Http(http_port_, "GET", "/static/status.css").status, 200);
  EXPECT_EQ(Http(http_port_, "GET", "/nothing/here").status, 404);

  // Read-only: GET and HEAD only.
  for (const char* method : {"POST", "PUT", "DELETE", "PATCH", "OPTIONS"}) {
    HttpAnswer refused = Http(http_port_, method, "/api/jobs");
    EXPECT_EQ(refused.status, 405) << method;
    EXPECT_THAT(refused.head, HasSubstr("Allow: GET, HEAD")) << method;
  }
  // A page from elsewhere cannot reach the port through a DNS name rebound to 127.0.0.1.
  EXPECT_EQ(Http(http_port_, "GET", "/api/jobs", "Host: rebound.example.com:80\r\n").status, 421);
  EXPECT_EQ(Http(http_port_, "GET", "/", "Host: 127.0.0.1.nip.io\r\n").status, 421);
  EXPECT_EQ(Http(http_port_, "GET", "/api/jobs", absl::StrCat("Host: localhost:", http_port_, "\r\n")).status, 200);
  EXPECT_EQ(Http(http_port_, "GET", "/api/jobs", absl::StrCat("Host: [::1]:", http_port_, "\r\n")).status, 200);
  HttpAnswer head = Http(http_port_, "HEAD", "/api/jobs");
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.body, "");
}

TEST_F(StatusPageTest, TokensGuardTheDataUsersSeeTheirOwnJobsAdminsAll) {
  const std::string tokens = state_ + "/tokens";
  {
    std::ofstream out(tokens);
    for (const auto& [token, user, role] : std::vector<std::tuple<std::string, std::string, std::string>>{
             {"alice-token-0123456789", "alice", "user"}, {"bob-token-0123456789", "bob", "user"},
             {"ops-token-0123456789", "ops", "admin"}}) {
      CommandResult line = RunCommand(absl::StrCat("echo ", token, " | ", BinaryDir(),
                                                   "/cli/qloractl hash-token --user ", user, " --role ", role));
      ASSERT_EQ(line.exit_code, 0) << line.output;
      out << line.output;
    }
  }
  fs::permissions(tokens, fs::perms::owner_read | fs::perms::owner_write);
  auto c = Start("--auth-tokens " + tokens);

  // alice submits over gRPC with her token.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  ctx.AddMetadata("authorization", "Bearer alice-token-0123456789");
  v1::SubmitJobRequest req;
  req.set_job_yaml(ShortJob());
  req.set_dataset(TrainData());
  req.set_name("alice's <b>job</b>");
  v1::SubmitJobResponse resp;
  ASSERT_TRUE(c->jobs()->SubmitJob(&ctx, req, &resp).ok());
  const std::string id = resp.job().id();

  for (const char* path : {"/api/jobs", "/metrics"}) {
    HttpAnswer anonymous = Http(http_port_, "GET", path);
    EXPECT_EQ(anonymous.status, 401) << path;
    EXPECT_THAT(anonymous.head, HasSubstr("WWW-Authenticate: Bearer")) << path;
    EXPECT_EQ(Http(http_port_, "GET", path, Bearer("alice-token-guessed")).status, 401) << path;
    EXPECT_EQ(Http(http_port_, "GET", path, "Authorization: Basic YWxpY2U6eA==\r\n").status, 401) << path;
  }
  const std::string job_path = absl::StrCat("/api/jobs/", id);
  EXPECT_EQ(Http(http_port_, "GET", job_path).status, 401);
  // A token in the URL is not a credential.
  EXPECT_EQ(Http(http_port_, "GET", "/api/jobs?token=alice-token-0123456789").status, 401);

  HttpAnswer alice = Http(http_port_, "GET", "/api/jobs", Bearer("alice-token-0123456789"));
  EXPECT_EQ(alice.status, 200);
  EXPECT_THAT(alice.body, HasSubstr(id));
  EXPECT_EQ(Http(http_port_, "GET", job_path, Bearer("alice-token-0123456789")).status, 200);
  HttpAnswer bob = Http(http_port_, "GET", "/api/jobs", Bearer("bob-token-0123456789"));
  EXPECT_EQ(bob.status, 200);
  EXPECT_THAT(bob.body, Not(HasSubstr(id)));
  EXPECT_EQ(Http(http_port_, "GET", job_path, Bearer("bob-token-0123456789")).status, 403);
  HttpAnswer ops = Http(http_port_, "GET", "/api/jobs", Bearer("ops-token-0123456789"));
  EXPECT_THAT(ops.body, HasSubstr(id));

  // /metrics covers every user's jobs: admins only.
  EXPECT_EQ(Http(http_port_, "GET", "/metrics", Bearer("alice-token-0123456789")).status, 403);
  std::vector<Sample> m = Scrape(Bearer("ops-token-0123456789"));
  EXPECT_TRUE(Value(m, "qlora_jobs", {{"state", "queued"}}));
  // The shell holds no data and needs no token.
  EXPECT_EQ(Http(http_port_, "GET", "/").status, 200);
  // (The harness's waits call without a token; the API says when the job is done.)
  EXPECT_TRUE(WaitUntil([&] {
    return absl::StrContains(Http(http_port_, "GET", job_path, Bearer("alice-token-0123456789")).body,
                             "\"state\":\"succeeded\"");
  }, 300)) << ReadLog();
}

// Slow clients do not take the page down (issue 58: 16 connections sending a byte a second made
// every request time out for 50 s, with 4 server threads and a 10 s read deadline): while 16
// such clients trickle, /metrics answers each request within a second and a half.
TEST_F(StatusPageTest, SlowClientsDoNotTakeThePageDown) {
  auto c = Start();
  ASSERT_TRUE(c->started());
  std::vector<int> slow;
  for (int i = 0; i < 16; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(http_port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    (void)!write(fd, "GET /metrics HTTP/1.1\r\n", 23);
    slow.push_back(fd);
  }
  std::atomic<bool> stop{false};
  std::thread trickle([&] {  // a byte a second on each, for at most 6 s
    for (int second = 0; second < 6 && !stop.load(); ++second) {
      for (int fd : slow) (void)!send(fd, "X", 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  for (int i = 0; i < 5; ++i) {
    const auto begin = std::chrono::steady_clock::now();
    const HttpAnswer a = Http(http_port_, "GET", "/metrics");
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    EXPECT_EQ(a.status, 200) << "request " << i;
    EXPECT_LT(seconds, 1.5) << "request " << i << " waited behind the slow clients";
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  stop.store(true);
  trickle.join();
  for (int fd : slow) close(fd);
}

TEST_F(StatusPageTest, NonLoopbackAddressNeedsInsecure) {
  const CommandResult refused = RunCommand(absl::StrCat(
      BinaryDir(), "/coordinator/qlora-coordinator --address 127.0.0.1:0 --state-dir ", state_,
      "/refused --cpu-workers 1 --metrics-address 0.0.0.0:0"));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr("--metrics-address 0.0.0.0:0 is not a loopback address"));
}

// Headless Chromium, as a person would look at it: the job list shows the job (its hostile name
// as text), the job's page draws its loss curve from the polled API while it trains.
class StatusPageBrowserTest : public StatusPageTest {
 protected:
  static std::string Chromium() {
    for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
      CommandResult which = RunCommand(absl::StrCat("command -v ", name));
      if (which.exit_code == 0) return std::string(absl::StripTrailingAsciiWhitespace(which.output));
    }
    return "";
  }

  // `--headless` Chromium with a profile of its own, no network beyond this host, no GPU.
  std::string Browser(const std::string& args) const {
    return absl::StrCat(chromium_, " --headless --no-sandbox --disable-gpu --no-first-run --disable-extensions ",
                        "--disable-background-networking --disable-component-update --disable-sync ",
                        "--user-data-dir=", state_, "/chromium-profile ", args, " 2>/dev/null");
  }

  // The document after the page's script ran (virtual time lets its polls happen).
  std::string Dom(const std::string& url) const {
    return RunCommand(Browser(absl::StrCat("--virtual-time-budget=5000 --dump-dom ", url))).output;
  }

  std::string chromium_ = Chromium();
};

TEST_F(StatusPageBrowserTest, PageShowsTheJobAndDrawsItsLossCurveWhileItTrains) {
  if (chromium_.empty()) GTEST_SKIP() << "chromium is not installed (scripts/setup.sh installs it)";
  auto c = Start();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::SubmitJobRequest req;
  req.set_job_yaml(LongJob());
  req.set_dataset(TrainData());
  req.set_name("<img src=x id=injected onerror=alert(1)>tiny");
  v1::SubmitJobResponse resp;
  ASSERT_TRUE(c->jobs()->SubmitJob(&ctx, req, &resp).ok());
  const std::string id = resp.job().id();
  ASSERT_TRUE(WaitUntil([&] {
    return ParseMetrics(Http(http_port_, "GET", "/metrics").body).size() > 0 &&
           Value(ParseMetrics(Http(http_port_, "GET", "/metrics").body), "qlora_job_step", {{"job", id}})
                   .value_or(0) >= 3;
  }, 240)) << ReadLog();

  const std::string base = absl::StrCat("http://127.0.0.1:", http_port_);
  const std::string list = Dom(base + "/");
  EXPECT_THAT(list, HasSubstr(absl::StrCat("data-id=\"", id, "\"")));
  EXPECT_THAT(list, HasSubstr(absl::StrCat("href=\"/jobs/", id, "\"")));
  EXPECT_THAT(list, HasSubstr("&lt;img src=x id=injected onerror=alert(1)&gt;tiny")) << "the name, as text";
  EXPECT_THAT(list, Not(HasSubstr("id=\"injected\"")));
  EXPECT_THAT(list, HasSubstr("state-running"));

  std::string page;
  std::smatch points;
  const std::regex curve(R"re(<path class="curve" id="curve-loss" d="M[0-9. L]+" data-points="(\d+)")re");
  ASSERT_TRUE(WaitUntil([&] {
    page = Dom(base + "/jobs/" + id);
    return std::regex_search(page, points, curve) && std::stoi(points[1]) >= 2;
  }, 120)) << page;
  EXPECT_THAT(page, HasSubstr("id=\"curve-learning_rate\""));
  EXPECT_THAT(page, HasSubstr("id=\"curve-tokens_per_second\""));
  EXPECT_THAT(page, HasSubstr("&lt;img src=x id=injected"));
  EXPECT_THAT(page, Not(HasSubstr("id=\"injected\"")));
  EXPECT_THAT(page, Not(HasSubstr("<pre id=\"log\"></pre>"))) << "the log's tail is shown";

  const std::string artifacts = BinaryDir() + "/test-artifacts";
  fs::create_directories(artifacts);
  const std::string shot = artifacts + "/status-page.png";
  fs::remove(shot);
  RunCommand(Browser(absl::StrCat("--virtual-time-budget=5000 --window-size=1280,1000 --screenshot=", shot, " ",
                                  base, "/jobs/", id)));
  EXPECT_TRUE(fs::exists(shot) && fs::file_size(shot) > 1000) << shot;
  std::printf("status page screenshot: %s\n", shot.c_str());
  Cancel(*c, id);
}

}  // namespace
}  // namespace qlora::testing
