//! jsonrpc
