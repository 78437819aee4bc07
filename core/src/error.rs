//! placeholder
#[derive(Debug)]
pub enum RpcError {}
#[derive(Debug)]
pub enum HttpError {}
