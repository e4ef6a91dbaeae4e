//! Incremental server-sent events parser. (Being written.)
