#!/bin/sh
# Start the tracking server: runs, registry and users in PostgreSQL, artifacts proxied by the
# server (clients see mlflow-artifacts:/), basic auth on. Secrets come from the environment,
# never from the image: POSTGRES_* for the database, MLFLOW_AUTH_ADMIN_PASSWORD for the first
# admin (ignored once the admin exists), MLFLOW_FLASK_SERVER_SECRET_KEY for the session cookie.
#
# The database password goes to libpq as PGPASSWORD (with PGHOST, PGPORT and PGUSER): the store
# URIs carry only the database name (`postgresql:///mlflow`), so the password is never part of a
# URI (nothing to percent-escape: any character works), never on a command line (the backend
# store URI is passed as MLFLOW_BACKEND_STORE_URI, not --backend-store-uri) and never in a file
# (the auth config, /etc/mlflow/basic_auth.ini, names only its database). Nothing is written to
# /tmp. For TLS to PostgreSQL set PGSSLMODE (e.g. verify-full) and PGSSLROOTCERT.
set -eu
: "${POSTGRES_HOST:?}" "${POSTGRES_USER:?}" "${POSTGRES_PASSWORD:?}" "${MLFLOW_AUTH_ADMIN_PASSWORD:?}"
: "${MLFLOW_FLASK_SERVER_SECRET_KEY:?}"
PGHOST="${POSTGRES_HOST}"
PGPORT="${POSTGRES_PORT:-5432}"
PGUSER="${POSTGRES_USER}"
PGPASSWORD="${POSTGRES_PASSWORD}"
export PGHOST PGPORT PGUSER PGPASSWORD
unset POSTGRES_PASSWORD
MLFLOW_BACKEND_STORE_URI="postgresql:///${POSTGRES_DB:-mlflow}"
MLFLOW_AUTH_CONFIG_PATH="${MLFLOW_AUTH_CONFIG_PATH:-/etc/mlflow/basic_auth.ini}"
export MLFLOW_BACKEND_STORE_URI MLFLOW_AUTH_CONFIG_PATH
# 0.0.0.0 inside the container only: compose publishes the port on 127.0.0.1, Kubernetes keeps it
# behind a ClusterIP Service and a NetworkPolicy (deploy/README.md, "Security").
exec mlflow server --host 0.0.0.0 --port "${MLFLOW_PORT:-5000}" \
    --artifacts-destination "${MLFLOW_ARTIFACTS_DESTINATION:-/mlartifacts}" \
    --app-name basic-auth
