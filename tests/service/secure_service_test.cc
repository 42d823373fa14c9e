// End-to-end tests of the coordinator's TLS and authentication: the real qlora-coordinator,
// qlora-worker and qloractl, with certificates and keys made in the test by Debian's openssl.
// Checks what a team sharing one coordinator relies on: no credentials -> UNAUTHENTICATED,
// another user's job -> PERMISSION_DENIED, admins see all, expired and wrong-CA certificates are
// refused, tokens are re-read on SIGHUP, and a job trains end to end with its workers dialling
// the coordinator over TLS.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include <grpcpp/grpcpp.h>
#include "grpc/health/v1/health.grpc.pb.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/service_harness.h"
#include "tests/util/files.h"

namespace qlora::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A CA, certificates signed by it, and a second, unrelated CA: made once for the test binary.
class Pki {
 public:
  static const Pki& Get() {
    static const Pki* pki = new Pki();
    return *pki;
  }
  bool ok() const { return ok_; }
  std::string dir;
  std::string Path(const std::string& name) const { return dir + "/" + name; }

 private:
  Pki() {
    dir = MakeTempDir("qlora-pki-");
    ok_ = MakeCa("ca") && MakeCa("other-ca") &&
          // The coordinator's certificate covers the address the tests and workers dial.
          Issue("ca", "server", "localhost", "subjectAltName=IP:127.0.0.1,DNS:localhost", 2) &&
          Issue("ca", "expired-server", "localhost", "subjectAltName=IP:127.0.0.1,DNS:localhost", -1) &&
          Issue("ca", "alice", "alice", "", 2) && Issue("ca", "ops", "ops", "", 2) &&
          Issue("ca", "expired-alice", "alice", "", -1) && Issue("other-ca", "mallory", "alice", "", 2);
  }
  bool Run(const std::string& command) {
    const CommandResult r = RunCommand(absl::StrCat("cd ", dir, " && ", command));
    if (r.exit_code != 0) fprintf(stderr, "openssl failed: %s\n%s\n", command.c_str(), r.output.c_str());
    return r.exit_code == 0;
  }
  bool MakeCa(const std::string& name) {
    return Run(absl::StrCat("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ",
                            name, ".key -out ", name, ".crt -days 3 -subj /CN=", name));
  }
  // `days` -1 makes a certificate that expired yesterday.
  bool Issue(const std::string& ca, const std::string& name, const std::string& cn, const std::string& ext,
             int days) {
    std::string extfile;
    if (!ext.empty()) {
      WriteFile(Path(name + ".ext"), ext + "\n");
      extfile = absl::StrCat(" -extfile ", name, ".ext");
    }
    return Run(absl::StrCat("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ", name,
                            ".key -out ", name, ".csr -subj /CN=", cn)) &&
           Run(absl::StrCat("openssl x509 -req -in ", name, ".csr -CA ", ca, ".crt -CAkey ", ca,
                            ".key -CAcreateserial -out ", name, ".crt -days ", days, extfile));
  }
  bool ok_ = false;
};

struct Identity {
  std::string ca = "ca";   // the CA that the client trusts
  std::string cert;        // a client certificate (mTLS); "" = none
  std::string token;       // a bearer token; "" = none
};

// A JobService client over TLS as `who`.
class SecureClient {
 public:
  SecureClient(const std::string& address, const Identity& who) : token_(who.token) {
    const Pki& pki = Pki::Get();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadFile(pki.Path(who.ca + ".crt"));
    if (!who.cert.empty()) {
      ssl.pem_cert_chain = ReadFile(pki.Path(who.cert + ".crt"));
      ssl.pem_private_key = ReadFile(pki.Path(who.cert + ".key"));
    }
    stub_ = v1::JobService::NewStub(grpc::CreateChannel(address, grpc::SslCredentials(ssl)));
  }
  void Prepare(grpc::ClientContext* ctx) const {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    if (!token_.empty()) ctx->AddMetadata("authorization", "Bearer " + token_);
  }
  grpc::Status Submit(const std::string& yaml, v1::Job* job) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::SubmitJobRequest req;
    req.set_job_yaml(yaml);
    req.set_dataset(SourceDir() + "/examples/data/train.jsonl");
    v1::SubmitJobResponse resp;
    grpc::Status s = stub_->SubmitJob(&ctx, req, &resp);
    *job = resp.job();
    return s;
  }
  grpc::Status Get(const std::string& id, v1::Job* job) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::GetJobRequest req;
    req.set_id(id);
    return stub_->GetJob(&ctx, req, job);
  }
  grpc::Status Cancel(const std::string& id) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::CancelJobRequest req;
    req.set_id(id);
    v1::Job job;
    return stub_->CancelJob(&ctx, req, &job);
  }
  grpc::Status List(std::vector<std::string>* ids) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::ListJobsResponse resp;
    grpc::Status s = stub_->ListJobs(&ctx, v1::ListJobsRequest(), &resp);
    for (const v1::Job& j : resp.jobs()) ids->push_back(j.id());
    return s;
  }
  grpc::Status Watch(const std::string& id) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::WatchJobRequest req;
    req.set_id(id);
    auto reader = stub_->WatchJob(&ctx, req);
    v1::WatchJobResponse msg;
    while (reader->Read(&msg)) {
      if (msg.job().state() >= v1::JOB_STATE_SUCCEEDED) ctx.TryCancel();
    }
    return reader->Finish();
  }
  grpc::Status Logs(const std::string& id) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::StreamLogsRequest req;
    req.set_id(id);
    req.set_rank(-1);
    auto reader = stub_->StreamLogs(&ctx, req);
    v1::LogChunk chunk;
    while (reader->Read(&chunk)) {
    }
    return reader->Finish();
  }
  v1::Job WaitForEnd(const std::string& id, double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    v1::Job job;
    while (std::chrono::steady_clock::now() < end) {
      if (Get(id, &job).ok() && job.state() >= v1::JOB_STATE_SUCCEEDED) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return job;
  }

 private:
  std::string token_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

constexpr char kAliceToken[] = "alice-token-0123456789abcdef";
constexpr char kBobToken[] = "bob-token-0123456789abcdef";
constexpr char kOpsToken[] = "ops-token-0123456789abcdef";
constexpr char kCarolToken[] = "carol-token-0123456789abcdef";

// The tokens-file line for `token`, made by qloractl hash-token as an operator would.
std::string TokenLine(const std::string& token, const std::string& user, const std::string& role) {
  const CommandResult r = RunCommand(absl::StrCat("echo ", token, " | ", BinaryDir(),
                                                  "/cli/qloractl hash-token --user ", user, " --role ", role));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.size(), 7u + 64u + 1 + user.size() + 1 + role.size() + 1) << r.output;
  EXPECT_EQ(r.output.find(token), std::string::npos) << "the token itself is never printed";
  return r.output;
}

class SecureServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(TinyModelDir().empty()) << "could not make the tiny model";
    ASSERT_TRUE(Pki::Get().ok()) << "could not make the test certificates with openssl";
    state_ = MakeTempDir("qlora-secure-");
    tokens_ = state_ + "/tokens";
    WriteFile(tokens_, absl::StrCat("# users of the test\n", TokenLine(kAliceToken, "alice", "user"),
                                    TokenLine(kBobToken, "bob", "user"), TokenLine(kOpsToken, "ops", "admin")));
    fs::permissions(tokens_, fs::perms::owner_read | fs::perms::owner_write);
  }
  void TearDown() override { fs::remove_all(state_); }

  // TLS flags for the coordinator, with its own certificate `server`.
  std::string TlsFlags(const std::string& server = "server") const {
    const Pki& pki = Pki::Get();
    return absl::StrCat("--tls-cert ", pki.Path(server + ".crt"), " --tls-key ", pki.Path(server + ".key"),
                        " --tls-ca ", pki.Path("ca.crt"));
  }
  std::string state_;
  std::string tokens_;
};

TEST_F(SecureServiceTest, UsersSeeTheirOwnJobsAdminsSeeAllAndTheJobTrainsOverTls) {
  CoordinatorProcess c(state_ + "/s", 1, absl::StrCat(TlsFlags(), " --auth-tokens ", tokens_));
  ASSERT_TRUE(c.started()) << ReadFile(state_ + "/s/coordinator.log");
  SecureClient nobody(c.address(), {});
  SecureClient alice(c.address(), {.token = kAliceToken});
  SecureClient bob(c.address(), {.token = kBobToken});
  SecureClient ops(c.address(), {.token = kOpsToken});
  SecureClient forger(c.address(), {.token = "alice-token-guessed"});

  v1::Job job;
  EXPECT_EQ(nobody.Submit(ShortJob(), &job).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(forger.Submit(ShortJob(), &job).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  std::vector<std::string> ids;
  EXPECT_EQ(nobody.List(&ids).error_code(), grpc::StatusCode::UNAUTHENTICATED);

  grpc::Status submitted = alice.Submit(ShortJob(), &job);
  ASSERT_TRUE(submitted.ok()) << submitted.error_message();
  const std::string id = job.id();
  EXPECT_EQ(job.owner(), "alice");

  // Bob can neither see nor touch it, and his list is empty.
  v1::Job seen;
  EXPECT_EQ(bob.Get(id, &seen).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(bob.Cancel(id).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(bob.Watch(id).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(bob.Logs(id).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(nobody.Get(id, &seen).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  ids.clear();
  ASSERT_TRUE(bob.List(&ids).ok());
  EXPECT_TRUE(ids.empty());
  // The admin sees everyone's jobs.
  ids.clear();
  ASSERT_TRUE(ops.List(&ids).ok());
  EXPECT_EQ(ids, std::vector<std::string>{id});
  EXPECT_TRUE(ops.Get(id, &seen).ok());

  // The workers dial the coordinator over TLS: the job trains to the end.
  const v1::Job done = alice.WaitForEnd(id, 240);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.state_message() << "\n"
                                                   << ReadFile(state_ + "/s/coordinator.log");
  EXPECT_TRUE(alice.Logs(id).ok());

  // qloractl with a CA and a token file; without a token it says it is not authenticated.
  const std::string token_file = state_ + "/alice.token";
  WriteFile(token_file, std::string(kAliceToken) + "\n");
  const std::string ctl = absl::StrCat(BinaryDir(), "/cli/qloractl --address ", c.address(), " --tls-ca ",
                                       Pki::Get().Path("ca.crt"));
  const CommandResult got = RunCommand(absl::StrCat(ctl, " --token-file ", token_file, " get ", id));
  EXPECT_EQ(got.exit_code, 0) << got.output;
  EXPECT_THAT(got.output, HasSubstr("owner:       alice"));
  const CommandResult anonymous = RunCommand(absl::StrCat("env -u QLORA_TOKEN -u QLORA_TOKEN_FILE ", ctl, " list"));
  EXPECT_EQ(anonymous.exit_code, 7) << anonymous.output;
  EXPECT_THAT(anonymous.output, HasSubstr("no credentials"));

  // Generation: its worker dials over TLS with a token of its own; only the job's owner (or an
  // admin) may generate with the job's adapter.
  const CommandResult generated =
      RunCommand(absl::StrCat(ctl, " --token-file ", token_file, " generate ", id, " -p hi --max-new-tokens 4 -o json"));
  EXPECT_EQ(generated.exit_code, 0) << generated.output << ReadFile(state_ + "/s/coordinator.log");
  EXPECT_THAT(generated.output, HasSubstr("\"finish_reason\""));
  const std::string bob_file = state_ + "/bob.token";
  WriteFile(bob_file, std::string(kBobToken) + "\n");
  const CommandResult denied = RunCommand(absl::StrCat(ctl, " --token-file ", bob_file, " generate ", id, " -p hi"));
  EXPECT_EQ(denied.exit_code, 7) << denied.output;
}

TEST_F(SecureServiceTest, PlaintextAndWrongCaClientsCannotConnect) {
  CoordinatorProcess c(state_ + "/s", 1, absl::StrCat(TlsFlags(), " --auth-tokens ", tokens_));
  ASSERT_TRUE(c.started()) << ReadFile(state_ + "/s/coordinator.log");
  // The harness's own channel is plaintext: the TLS port does not answer it.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  ctx.AddMetadata("authorization", std::string("Bearer ") + kAliceToken);
  v1::ListJobsResponse resp;
  EXPECT_EQ(c.jobs()->ListJobs(&ctx, v1::ListJobsRequest(), &resp).error_code(), grpc::StatusCode::UNAVAILABLE);
  // A client that trusts another CA refuses the coordinator's certificate.
  SecureClient wrong_ca(c.address(), {.ca = "other-ca", .token = kAliceToken});
  std::vector<std::string> ids;
  EXPECT_EQ(wrong_ca.List(&ids).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(SecureServiceTest, ExpiredServerCertificateStopsTheStartNamingIt) {
  const CommandResult r = RunCommand(absl::StrCat(
      "timeout 20 ", BinaryDir(), "/coordinator/qlora-coordinator --address 127.0.0.1:0 --state-dir ", state_,
      "/expired --cpu-workers 1 ", TlsFlags("expired-server"), " --auth-tokens ", tokens_));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("has expired"));
  const CommandResult mismatched = RunCommand(absl::StrCat(
      "timeout 20 ", BinaryDir(), "/coordinator/qlora-coordinator --address 127.0.0.1:0 --state-dir ", state_,
      "/mismatch --cpu-workers 1 --tls-cert ", Pki::Get().Path("server.crt"), " --tls-key ",
      Pki::Get().Path("alice.key")));
  EXPECT_EQ(mismatched.exit_code, 2) << mismatched.output;
  EXPECT_THAT(mismatched.output, HasSubstr("is not the key of --tls-cert"));
}

TEST_F(SecureServiceTest, ClientCertificatesIdentifyUsersAndBadOnesAreRefused) {
  CoordinatorProcess c(state_ + "/s", 1,
                       absl::StrCat(TlsFlags(), " --tls-client-ca ", Pki::Get().Path("ca.crt"), " --auth-tokens ",
                                    tokens_));
  ASSERT_TRUE(c.started()) << ReadFile(state_ + "/s/coordinator.log");
  SecureClient alice(c.address(), {.cert = "alice"});
  SecureClient ops(c.address(), {.cert = "ops"});  // an admin by the tokens file's role for "ops"
  SecureClient mallory(c.address(), {.cert = "mallory"});   // CN=alice, signed by another CA
  SecureClient expired(c.address(), {.cert = "expired-alice"});
  SecureClient nobody(c.address(), {});

  v1::Job job;
  grpc::Status submitted = alice.Submit(LongJob(), &job);
  ASSERT_TRUE(submitted.ok()) << submitted.error_message();
  EXPECT_EQ(job.owner(), "alice");
  std::vector<std::string> ids;
  EXPECT_EQ(mallory.List(&ids).error_code(), grpc::StatusCode::UNAVAILABLE) << "a foreign CA's certificate";
  EXPECT_EQ(expired.List(&ids).error_code(), grpc::StatusCode::UNAVAILABLE) << "an expired certificate";
  EXPECT_EQ(nobody.List(&ids).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  ids.clear();
  ASSERT_TRUE(ops.List(&ids).ok());
  EXPECT_EQ(ids, std::vector<std::string>{job.id()});
  EXPECT_TRUE(ops.Cancel(job.id()).ok());
}

TEST_F(SecureServiceTest, TokensFileIsReReadOnSighup) {
  CoordinatorProcess c(state_ + "/s", 1, absl::StrCat(TlsFlags(), " --auth-tokens ", tokens_));
  ASSERT_TRUE(c.started()) << ReadFile(state_ + "/s/coordinator.log");
  SecureClient carol(c.address(), {.token = kCarolToken});
  std::vector<std::string> ids;
  EXPECT_EQ(carol.List(&ids).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  AppendFile(tokens_, TokenLine(kCarolToken, "carol", "user"));
  kill(c.pid(), SIGHUP);
  bool admitted = false;
  for (int i = 0; i < 50 && !admitted; ++i) {
    admitted = carol.List(&ids).ok();
    if (!admitted) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(admitted);
  // A broken file leaves the previous users in force.
  WriteFile(tokens_, "not a tokens file\n");
  kill(c.pid(), SIGHUP);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(carol.List(&ids).ok());
  EXPECT_THAT(ReadFile(state_ + "/s/coordinator.log"), HasSubstr("kept the previous tokens"));
}

TEST_F(SecureServiceTest, NonLoopbackNeedsTlsAndAuthenticationNotInsecure) {
  CoordinatorProcess c(state_ + "/s", 1, absl::StrCat("--address 0.0.0.0:0 ", TlsFlags(), " --auth-tokens ", tokens_,
                                                      " --health-address 127.0.0.1:0"));
  ASSERT_TRUE(c.started()) << ReadFile(state_ + "/s/coordinator.log");
  const std::string log = ReadFile(state_ + "/s/coordinator.log");
  EXPECT_THAT(log, ::testing::Not(HasSubstr("INSECURE")));
  // Probes that cannot speak TLS ask the plaintext health port, which serves nothing else.
  const std::string marker = "health (plaintext) on ";
  const size_t at = log.find(marker);
  ASSERT_NE(at, std::string::npos) << log;
  const std::string health_address = log.substr(at + marker.size(), log.find('\n', at) - at - marker.size());
  auto channel = grpc::CreateChannel(health_address, grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckResponse health;
  ASSERT_TRUE(grpc::health::v1::Health::NewStub(channel)->Check(&ctx, {}, &health).ok());
  EXPECT_EQ(health.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  grpc::ClientContext list_ctx;
  list_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  list_ctx.AddMetadata("authorization", std::string("Bearer ") + kOpsToken);
  v1::ListJobsResponse jobs;
  EXPECT_EQ(v1::JobService::NewStub(channel)->ListJobs(&list_ctx, {}, &jobs).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  const CommandResult tls_only = RunCommand(absl::StrCat(
      "timeout 20 ", BinaryDir(), "/coordinator/qlora-coordinator --address 0.0.0.0:0 --state-dir ", state_,
      "/tls-only --cpu-workers 1 ", TlsFlags()));
  EXPECT_EQ(tls_only.exit_code, 2) << tls_only.output;
  EXPECT_THAT(tls_only.output, HasSubstr("no client authentication"));
}

}  // namespace
}  // namespace qlora::testing
