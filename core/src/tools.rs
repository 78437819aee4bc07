pub const GATEWAY_TOOLS: &[&str] = &["switch_project", "list_projects"];
