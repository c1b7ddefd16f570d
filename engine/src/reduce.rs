//! placeholder: being written.
