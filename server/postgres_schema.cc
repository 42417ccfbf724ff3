#include "server/postgres_schema.h"

#include "absl/strings/str_cat.h"
#include "optimizer/failure.h"

namespace onnxopt::server {
namespace {

// Any fixed number; the lock is held only while migrating.
constexpr char kMigrationLock[] = "SELECT pg_advisory_lock(7265803196)";
constexpr char kMigrationUnlock[] = "SELECT pg_advisory_unlock(7265803196)";

}  // namespace

const std::vector<PostgresMigration>& PostgresMigrations() {
  static const std::vector<PostgresMigration> migrations = {
      {1, "jobs, their queue and leases; settings",
       // One row per job: the serialized onnxopt.v1.Job, plus the columns queries select on. `state`
       // is a JobState number (1 QUEUED, 2 RUNNING, 3 SUCCEEDED, 4 FAILED, 5 CANCELLED). `version`
       // counts changes (WatchJob); the lease columns are set while a replica runs the job.
       R"sql(
CREATE TABLE onnxopt_jobs (
  sequence BIGSERIAL PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  tenant TEXT NOT NULL,
  request_id TEXT NOT NULL DEFAULT '',
  state INTEGER NOT NULL,
  priority INTEGER NOT NULL DEFAULT 0,
  wants_cuda BOOLEAN NOT NULL DEFAULT false,
  cache_key TEXT NOT NULL DEFAULT '',
  cancel_requested BOOLEAN NOT NULL DEFAULT false,
  version BIGINT NOT NULL DEFAULT 0,
  lease_owner TEXT,          -- the lease token: "<replica>#<attempt>"
  lease_expires TIMESTAMPTZ,
  job BYTEA NOT NULL
);
CREATE UNIQUE INDEX onnxopt_jobs_request_id ON onnxopt_jobs (tenant, request_id) WHERE request_id <> '';
CREATE INDEX onnxopt_jobs_queue ON onnxopt_jobs (priority DESC, sequence) WHERE state = 1;
CREATE INDEX onnxopt_jobs_leases ON onnxopt_jobs (lease_expires) WHERE state = 2;
CREATE INDEX onnxopt_jobs_cache ON onnxopt_jobs (tenant, cache_key) WHERE state = 3;
CREATE INDEX onnxopt_jobs_tenant ON onnxopt_jobs (tenant, sequence);
CREATE TABLE onnxopt_settings (
  name TEXT PRIMARY KEY,
  value BYTEA NOT NULL
);
)sql"},
  };
  return migrations;
}

absl::Status MigratePostgres(pg::Connection& connection) {
  if (auto locked = connection.Exec(kMigrationLock); !locked.ok()) return locked.status();
  auto migrate = [&]() -> absl::Status {
    auto created = connection.Exec(
        "CREATE TABLE IF NOT EXISTS onnxopt_schema_migrations (version INTEGER PRIMARY KEY, description TEXT NOT NULL, "
        "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())");
    if (!created.ok()) return created.status();
    auto current = connection.Exec("SELECT coalesce(max(version), 0) FROM onnxopt_schema_migrations");
    if (!current.ok()) return current.status();
    const int64_t applied = current->Int(0, 0);
    const int latest = PostgresMigrations().back().version;
    if (applied > latest) {
      return Failure(
          absl::StatusCode::kFailedPrecondition, v1::ErrorReason::JOB_STORE_SCHEMA_NEWER,
          absl::StrCat("the job store's schema is version ", applied, " but this onnxopt knows versions up to ", latest,
                       "; run a newer onnxopt against it"));
    }
    for (const PostgresMigration& migration : PostgresMigrations()) {
      if (migration.version <= applied) continue;
      absl::Status status = connection.Transaction([&]() -> absl::Status {
        if (auto done = connection.Exec(migration.sql); !done.ok()) return done.status();
        auto recorded = connection.Exec("INSERT INTO onnxopt_schema_migrations (version, description) VALUES ($1, $2)",
                                        {migration.version, migration.description});
        return recorded.status();
      });
      if (!status.ok()) {
        return WithReason(absl::Status(status.code(), absl::StrCat("migration ", migration.version, " (",
                                                                   migration.description, "): ", status.message())),
                          ReasonOf(status));
      }
    }
    return absl::OkStatus();
  };
  absl::Status status = migrate();
  (void)connection.Exec(kMigrationUnlock);
  return status;
}

}  // namespace onnxopt::server
