"""The only layer that talks to Ray and MLflow: CLIs, fan-out, fingerprint, registry, launch."""
