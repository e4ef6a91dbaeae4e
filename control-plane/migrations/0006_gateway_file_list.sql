-- `GET /v1/files` pages through a workspace's files by (created_at, id).
CREATE INDEX managed_files_workspace ON managed_files (workspace, created_at, id);
