//! The fields that place a target at a cloud provider and carry its credentials, wherever
//! they come from (a config node, the headers of spec 5.3, a stored credential).

use serde_json::{Map, Value};

/// The fields that place a target at a cloud provider and carry its credentials (Azure's
/// `resource_name`, `deployment_id`, `api_version`, `deployments` and the `cloud_*` fields),
/// from a config node, the headers of spec 5.3 or a stored credential. Each provider checks
/// the ones it needs when a target is built.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CloudFields {
    pub resource_name: Option<String>,
    pub deployment_id: Option<String>,
    pub api_version: Option<String>,
    pub deployments: Vec<Deployment>,
    /// `x-gateway-cloud-a-model-name` (a header; the config has no such field).
    pub azure_model_name: Option<String>,
    pub azure_region: Option<String>,
    pub azure_deployment_name: Option<String>,
    pub azure_deployment_type: Option<AzureDeploymentType>,
    pub azure_endpoint_name: Option<String>,
    pub azure_api_version: Option<String>,
    pub gcp_project_id: Option<String>,
    pub gcp_region: Option<String>,
    pub gcp_service_account_json: Option<Map<String, Value>>,
    /// `X-Cloud-B-LLM-Request-Type` (a header), passed to Vertex under its own name.
    pub gcp_request_type: Option<String>,
    pub aws_access_key_id: Option<String>,
    pub aws_secret_access_key: Option<String>,
    pub aws_region: Option<String>,
    pub aws_session_token: Option<String>,
}

impl CloudFields {
    /// The config's property names of these fields.
    pub const KEYS: &'static [&'static str] = &[
        "resource_name",
        "deployment_id",
        "api_version",
        "deployments",
        "cloud_c_access_key_id",
        "cloud_c_secret_access_key",
        "cloud_c_region",
        "cloud_c_session_token",
        "cloud_b_project_id",
        "cloud_b_region",
        "cloud_b_service_account_json",
        "cloud_a_region",
        "cloud_a_deployment_name",
        "cloud_a_deployment_type",
        "cloud_a_endpoint_name",
        "cloud_a_api_version",
    ];

    /// Fields set here win; the others come from `fallback` (a config node over the headers,
    /// a stored credential over the headers).
    pub fn or(self, fallback: &CloudFields) -> CloudFields {
        let pick = |own: Option<String>, other: &Option<String>| own.or_else(|| other.clone());
        CloudFields {
            resource_name: pick(self.resource_name, &fallback.resource_name),
            deployment_id: pick(self.deployment_id, &fallback.deployment_id),
            api_version: pick(self.api_version, &fallback.api_version),
            deployments: if self.deployments.is_empty() { fallback.deployments.clone() } else { self.deployments },
            azure_model_name: pick(self.azure_model_name, &fallback.azure_model_name),
            azure_region: pick(self.azure_region, &fallback.azure_region),
            azure_deployment_name: pick(self.azure_deployment_name, &fallback.azure_deployment_name),
            azure_deployment_type: self.azure_deployment_type.or(fallback.azure_deployment_type),
            azure_endpoint_name: pick(self.azure_endpoint_name, &fallback.azure_endpoint_name),
            azure_api_version: pick(self.azure_api_version, &fallback.azure_api_version),
            gcp_project_id: pick(self.gcp_project_id, &fallback.gcp_project_id),
            gcp_region: pick(self.gcp_region, &fallback.gcp_region),
            gcp_request_type: pick(self.gcp_request_type, &fallback.gcp_request_type),
            gcp_service_account_json: self
                .gcp_service_account_json
                .or_else(|| fallback.gcp_service_account_json.clone()),
            aws_access_key_id: pick(self.aws_access_key_id, &fallback.aws_access_key_id),
            aws_secret_access_key: pick(self.aws_secret_access_key, &fallback.aws_secret_access_key),
            aws_region: pick(self.aws_region, &fallback.aws_region),
            aws_session_token: pick(self.aws_session_token, &fallback.aws_session_token),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Deployment {
    pub deployment_id: String,
    pub alias: String,
    pub api_version: String,
    pub is_default: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AzureDeploymentType {
    Serverless,
    Managed,
}

impl AzureDeploymentType {
    pub const ALL: [AzureDeploymentType; 2] = [Self::Serverless, Self::Managed];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Serverless => "serverless",
            Self::Managed => "managed",
        }
    }
}
