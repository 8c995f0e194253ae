// Carries the precompiled libtorch header that every torch-using target reuses.
