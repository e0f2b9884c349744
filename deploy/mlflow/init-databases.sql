-- The auth app keeps its users in a database of its own, beside the tracking store.
CREATE DATABASE mlflow_auth;
