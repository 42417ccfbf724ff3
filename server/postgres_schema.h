// The PostgreSQL job store's schema, as numbered migrations. A database records the versions applied
// in onnxopt_schema_migrations; a server applies the ones it lacks at start, one replica at a time (an
// advisory lock), and refuses a database whose schema is newer than it knows. Migrations are only
// ever appended: an applied one is never edited.
#ifndef ONNXOPT_SERVER_POSTGRES_SCHEMA_H_
#define ONNXOPT_SERVER_POSTGRES_SCHEMA_H_

#include <vector>

#include "absl/status/status.h"
#include "server/postgres.h"

namespace onnxopt::server {

struct PostgresMigration {
  int version;
  const char* description;
  const char* sql;
};
const std::vector<PostgresMigration>& PostgresMigrations();

// Brings the database to the latest schema. FAILED_PRECONDITION (JOB_STORE_SCHEMA_NEWER) when the
// database is ahead of this build.
absl::Status MigratePostgres(pg::Connection& connection);

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_POSTGRES_SCHEMA_H_
