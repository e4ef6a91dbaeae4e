//! Config object (spec 2.1-2.7, 7.1): schema and validation. (Being written.)
