"""Integrations with other libraries' extension points (imported on demand: each needs its library)."""
