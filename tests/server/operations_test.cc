// Small parts of the server's operations: labels, flag spelling, log lines.
#include <string>
#include <vector>

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "server/flag_spelling.h"
#include "server/job_labels.h"
#include "server/job_store.h"
#include "server/log.h"

namespace onnxopt::server {
namespace {

TEST(JobLabelsTest, AcceptsKubernetesLikeKeysAndFreeTextValues) {
  Labels labels;
  labels["team"] = "search";
  labels["mlflow.run_id"] = "4f1c";
  labels["app.kubernetes.io/part-of"] = "pipelines ünïcode";
  labels["0day"] = "";
  EXPECT_TRUE(ValidateLabels(labels, "labels").ok());
}

TEST(JobLabelsTest, RefusesBadKeysLongValuesAndTooMany) {
  for (const std::string& key : std::vector<std::string>{"", "Team", "-x", "a b", "x=y", std::string(64, 'k')}) {
    Labels labels;
    labels[key] = "v";
    const absl::Status status = ValidateLabels(labels, "labels");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_NE(status.message().find("BAD_LABEL"), absl::string_view::npos);
  }
  Labels long_value;
  long_value["k"] = std::string(kMaxLabelValueLength + 1, 'v');
  EXPECT_FALSE(ValidateLabels(long_value, "labels").ok());
  Labels not_utf8;
  not_utf8["k"] = "\xff\xfe";
  EXPECT_FALSE(ValidateLabels(not_utf8, "labels").ok());
  Labels many;
  for (int i = 0; i <= kMaxLabels; ++i) many["k" + std::to_string(i)] = "v";
  EXPECT_FALSE(ValidateLabels(many, "labels").ok());
}

TEST(JobLabelsTest, AFilterMatchesJobsCarryingEveryLabelAndTheState) {
  v1::Job job;
  job.set_state(v1::SUCCEEDED);
  (*job.mutable_labels())["team"] = "search";
  (*job.mutable_labels())["stage"] = "prod";
  JobFilter filter;
  EXPECT_TRUE(filter.Matches(job));
  filter.labels["team"] = "search";
  EXPECT_TRUE(filter.Matches(job));
  filter.labels["stage"] = "dev";
  EXPECT_FALSE(filter.Matches(job));
  filter.labels.erase("stage");
  filter.state = v1::FAILED;
  EXPECT_FALSE(filter.Matches(job));
}

TEST(FlagSpellingTest, DashesBecomeAbseilsUnderscoresAndUnderscoresAreNoted) {
  const SpelledArguments spelled =
      ToAbseilSpelling({"--data-dir=/d", "--tls_cert=c.pem", "--workers", "4", "-", "--", "--not-a-flag"});
  EXPECT_EQ(spelled.arguments, std::vector<std::string>({"--data_dir=/d", "--tls_cert=c.pem", "--workers", "4", "-",
                                                         "--", "--not-a-flag"}));
  ASSERT_EQ(spelled.notes.size(), 1u);
  EXPECT_EQ(spelled.notes[0], "--tls_cert is deprecated: spell it --tls-cert");
  EXPECT_EQ(ToAbseilSpelling({"--metrics-listen=a-b_c"}).arguments[0], "--metrics_listen=a-b_c")
      << "values are left as they are";
}

TEST(LogTest, JsonLinesCarryTimeLevelMessageJobAndTenant) {
  const std::string line = FormatLogLine(LogFormat::kJson, LogLevel::kWarning, "jobs/1 failed (PARITY_FAILED)",
                                         {"jobs/1", "team-a"});
  google::protobuf::Struct object;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(line, &object).ok()) << line;
  EXPECT_EQ(object.fields().at("level").string_value(), "warning");
  EXPECT_EQ(object.fields().at("msg").string_value(), "jobs/1 failed (PARITY_FAILED)");
  EXPECT_EQ(object.fields().at("job").string_value(), "jobs/1");
  EXPECT_EQ(object.fields().at("tenant").string_value(), "team-a");
  const std::string time = object.fields().at("time").string_value();
  EXPECT_EQ(time.size(), 24u) << time;  // 2026-11-26T16:01:21.123Z
  EXPECT_EQ(time.back(), 'Z');
  EXPECT_EQ(line.find('\n'), std::string::npos) << "one line";
  EXPECT_EQ(FormatLogLine(LogFormat::kText, LogLevel::kInfo, "started", {}), "onnxopt-server: started");
  EXPECT_FALSE(SetLogFormat("xml").ok());
}

}  // namespace
}  // namespace onnxopt::server
