//! Chat completion request validation (spec 2.9, 8). (Being written.)
