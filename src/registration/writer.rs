//! Writes the narrowed registration.
