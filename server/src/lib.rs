//! gateway server
