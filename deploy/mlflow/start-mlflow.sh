#!/bin/sh
# Start the tracking server: runs, registry and users in PostgreSQL, artifacts proxied by the
# server (clients see mlflow-artifacts:/), basic auth on. Secrets come from the environment,
# never from the image: POSTGRES_* for the database, MLFLOW_AUTH_ADMIN_PASSWORD for the first
# admin (ignored once the admin exists), MLFLOW_FLASK_SERVER_SECRET_KEY for the session cookie.
set -eu
: "${POSTGRES_HOST:?}" "${POSTGRES_USER:?}" "${POSTGRES_PASSWORD:?}" "${MLFLOW_AUTH_ADMIN_PASSWORD:?}"
: "${MLFLOW_FLASK_SERVER_SECRET_KEY:?}"
DB="postgresql://${POSTGRES_USER}:${POSTGRES_PASSWORD}@${POSTGRES_HOST}:${POSTGRES_PORT:-5432}"
cat > /tmp/basic_auth.ini <<INI
[mlflow]
default_permission = READ
database_uri = ${DB}/${POSTGRES_AUTH_DB:-mlflow_auth}
admin_username = ${MLFLOW_AUTH_ADMIN_USERNAME:-admin}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
INI
export MLFLOW_AUTH_CONFIG_PATH=/tmp/basic_auth.ini
exec mlflow server --host 0.0.0.0 --port "${MLFLOW_PORT:-5000}" \
    --backend-store-uri "${DB}/${POSTGRES_DB:-mlflow}" \
    --artifacts-destination "${MLFLOW_ARTIFACTS_DESTINATION:-/mlartifacts}" \
    --app-name basic-auth
