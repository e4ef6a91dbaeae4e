//! The lists the gateway merges (`GET /v1/batches`, `GET /v1/files`): the caller's workspace's
//! own items (managed batches, files kept by the gateway) beside the provider's list, read
//! through the gateway as the caller. One list in two parts: newest first, the gateway's
//! items and then the provider's (none of the provider's is newer than an item the gateway
//! made while in front of it); oldest first, the other way round. `after=<id>` continues in
//! the part the id belongs to, then in the next; `before=<id>` pages within its part; `limit`
//! counts across both parts, and `has_more` says whether either part has more.

use crate::auth;
use crate::db::batches::Cursor;
use crate::errors::{ApiError, ApiResult};
use crate::gateway::{caller_headers, send, workspace};
use crate::AppState;
use axum::extract::{Query, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gateway_schema::{control_plane_fetch_marker, CONTROL_PLANE_FETCH_HEADER};
use serde_json::{json, Value};
use std::time::Duration;

/// One merged list resource.
pub(crate) struct Listing {
    /// The path under `/v1` (`batches`, `files`).
    pub resource: &'static str,
    /// The name of one item in messages (`batch`, `file`).
    pub item: &'static str,
    /// The prefix of the ids the gateway gives its own items.
    pub prefix: &'static str,
    /// Items per page when the caller names no `limit` (OpenAI's default), and the most.
    pub default_limit: usize,
    pub max_limit: usize,
    /// Whether the caller's `order=asc` lists oldest first (files); else newest first always.
    pub ordered: bool,
}

/// The gateway's own items of the caller's workspace, in one list resource.
pub(crate) trait OwnItems: Sized {
    const LISTING: Listing;

    /// The items of `workspace` the caller's query (`params`) lists.
    fn of(s: &AppState, workspace: String, params: &[(String, String)]) -> Self;

    /// Where the workspace's item `id` stands in the list: its `(created_at, id)`.
    async fn position(&self, id: &str) -> ApiResult<Option<(i64, String)>>;

    /// Up to `limit` items from `cursor`, in the list's order (`newest_first` or not).
    async fn page(&self, cursor: &Cursor, newest_first: bool, limit: usize) -> ApiResult<Vec<Value>>;
}

/// The two parts of a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Own,
    Provider,
}

/// `GET /internal/v1/<resource>` (`batches`, `files`; the query checked by the filter): the
/// merged page of the caller's workspace.
pub(crate) async fn list<O: OwnItems>(
    State(s): State<AppState>,
    h: HeaderMap,
    RawQuery(query): RawQuery,
    Query(params): Query<Vec<(String, String)>>,
) -> ApiResult<Response> {
    auth::internal(&s, &h)?;
    let own = O::of(&s, workspace(&h)?, &params);
    merged(&s, &h, &O::LISTING, query.as_deref(), &params, &own).await
}

async fn merged(
    s: &AppState,
    h: &HeaderMap,
    listing: &Listing,
    query: Option<&str>,
    params: &[(String, String)],
    own: &impl OwnItems,
) -> ApiResult<Response> {
    let param = |name: &str| params.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str()).filter(|v| !v.is_empty());
    let limit = param("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .unwrap_or(listing.default_limit)
        .clamp(1, listing.max_limit);
    let newest_first = !listing.ordered || param("order") != Some("asc");
    let ours = |id: &str| id.starts_with(listing.prefix);
    if let Some(before) = param("before") {
        if !ours(before) {
            return Ok(match provider_list(s, h, listing, query.unwrap_or_default()).await {
                ProviderList::Page(data, has_more) => list_json(data, has_more),
                ProviderList::Absent => list_json(Vec::new(), false),
                ProviderList::Failed(response) => response,
            });
        }
        let (at, id) = position(own, listing, "before", before).await?;
        let mut items = own.page(&Cursor::Before(at, id), newest_first, limit + 1).await?;
        let has_more = items.len() > limit;
        if has_more {
            // The one too many is the farthest from `before`.
            items.remove(0);
        }
        return Ok(list_json(items, has_more));
    }
    let parts = if newest_first { [Part::Own, Part::Provider] } else { [Part::Provider, Part::Own] };
    let (first, mut cursor) = match param("after") {
        Some(after) if ours(after) => {
            let (at, id) = position(own, listing, "after", after).await?;
            (Part::Own, Some(Cursor::After(at, id)))
        }
        Some(_) => (Part::Provider, None),
        None => (parts[0], None),
    };
    let mut after_provider = first == Part::Provider && param("after").is_some();
    let mut data = Vec::new();
    for part in parts.iter().skip_while(|p| **p != first) {
        // A full page still reads one item of the next part: it tells whether more follow.
        let room = limit.saturating_sub(data.len());
        let (items, more) = match part {
            Part::Own => {
                let cursor = cursor.take().unwrap_or(Cursor::Start);
                let mut items = own.page(&cursor, newest_first, room + 1).await?;
                let more = items.len() > room;
                items.truncate(room);
                (items, more)
            }
            Part::Provider => {
                // A page the caller left at its default size, with nothing of the gateway's on
                // it, is asked as the caller asked it.
                let limit = (param("limit").is_some() || room != listing.default_limit).then_some(room.max(1));
                let query = provider_query(query, limit, std::mem::take(&mut after_provider));
                match provider_list(s, h, listing, &query).await {
                    ProviderList::Page(items, more) => {
                        let more = more || items.len() > room;
                        (items.into_iter().take(room).collect(), more)
                    }
                    ProviderList::Absent => (Vec::new(), false),
                    ProviderList::Failed(response) => return Ok(response),
                }
            }
        };
        data.extend(items);
        if more {
            return Ok(list_json(data, true));
        }
    }
    Ok(list_json(data, false))
}

/// Where the cursor `name`'s item `id` stands; a 400 when the workspace has no such item.
async fn position(own: &impl OwnItems, listing: &Listing, name: &str, id: &str) -> ApiResult<(i64, String)> {
    let at = own.position(id).await?;
    at.ok_or_else(|| ApiError::invalid(name, &format!("no {} {id}", listing.item)))
}

/// The query of a page of the provider's list: the caller's parameters as given, in order,
/// without `before` (and `after` unless `keep_after`: a provider id), with `limit` set to the
/// room left on the page (`None`: the caller's default page, no `limit` written). Names are
/// matched percent-decoded, as the filter checked them and `Query` read them (`l%69mit` is `limit`).
pub(crate) fn provider_query(query: Option<&str>, limit: Option<usize>, keep_after: bool) -> String {
    let limit = limit.map(|n| format!("limit={n}"));
    let mut limit_placed = false;
    let mut pairs: Vec<&str> = Vec::new();
    for pair in query.unwrap_or_default().split('&').filter(|pair| !pair.is_empty()) {
        let name = form_urlencoded::parse(pair.as_bytes()).next().map(|(name, _)| name).unwrap_or_default();
        match &*name {
            "before" => {}
            "after" if !keep_after => {}
            "limit" if limit_placed => {}
            "limit" => {
                pairs.extend(limit.as_deref());
                limit_placed = true;
            }
            _ => pairs.push(pair),
        }
    }
    if !limit_placed {
        pairs.extend(limit.as_deref());
    }
    pairs.join("&")
}

/// OpenAI's list: `data`, `first_id` and `last_id` (null when empty), `has_more`.
pub(crate) fn list_json(data: Vec<Value>, has_more: bool) -> Response {
    let id = |item: Option<&Value>| item.and_then(|b| b.get("id")).cloned().unwrap_or(Value::Null);
    let (first_id, last_id) = (id(data.first()), id(data.last()));
    Json(json!({"object": "list", "data": data, "first_id": first_id, "last_id": last_id, "has_more": has_more}))
        .into_response()
}

/// The provider's part of a list, read through the gateway as the caller.
enum ProviderList {
    /// A page: its items, and whether it has more.
    Page(Vec<Value>, bool),
    /// The provider has no such list (404, 405, 501, or the gateway's `unsupported_endpoint`).
    Absent,
    /// Its error (its status and OpenAI-shaped body), answered as it is: leaving its items out
    /// would present a partial list as whole.
    Failed(Response),
}

/// How long the provider's part of a list may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(60);

/// `GET <gateway>/v1/<resource>?<query>` as the caller, marked as the control plane's own
/// read so that the filter sends it to the provider.
async fn provider_list(s: &AppState, h: &HeaderMap, listing: &Listing, query: &str) -> ProviderList {
    let resource = listing.resource;
    let mut headers = caller_headers(h);
    headers.insert(CONTROL_PLANE_FETCH_HEADER.into(), json!(control_plane_fetch_marker(&s.internal_token)));
    let url = format!("{}/v1/{resource}?{query}", s.batches.settings.gateway_url);
    let request = s.batches.client.get(url).timeout(LIST_TIMEOUT);
    let unavailable = |message: &str| {
        let error = ApiError::new(502, "api_error", message, None, Some("provider_unavailable"));
        ProviderList::Failed(raw_json(502, String::from_utf8_lossy(&error.0.body).into_owned()))
    };
    let (status, text) = match send(request, &headers).await {
        Ok(answer) => answer,
        Err(e) => return unavailable(&format!("the provider's {resource} list could not be read: {e}")),
    };
    let body = serde_json::from_str::<Value>(&text).unwrap_or(Value::Null);
    match (status, body.get("data")) {
        (200..=299, Some(Value::Array(data))) => {
            ProviderList::Page(data.clone(), body.get("has_more").and_then(Value::as_bool).unwrap_or(false))
        }
        (404 | 405 | 501, _) => ProviderList::Absent,
        (400, _) if body.pointer("/error/code").and_then(Value::as_str) == Some("unsupported_endpoint") => {
            ProviderList::Absent
        }
        (200..=299, _) => unavailable(&format!("the provider's {resource} list is not an OpenAI list")),
        _ => ProviderList::Failed(raw_json(status, text)),
    }
}

fn raw_json(status: u16, body: String) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_providers_page_keeps_the_callers_other_parameters() {
        assert_eq!(provider_query(None, Some(20), false), "limit=20");
        assert_eq!(provider_query(None, None, false), "");
        assert_eq!(provider_query(Some("limit=5&after=batch_gw_1&x=%20y+z"), Some(3), false), "limit=3&x=%20y+z");
        assert_eq!(provider_query(Some("limits=2&before=b"), Some(1), false), "limits=2&limit=1");
        assert_eq!(provider_query(Some("purpose=batch&after=b"), None, false), "purpose=batch");
        // A provider's own cursor, and the caller's query otherwise as given.
        let query = "limit=100&after=batch_mock_1&x=%20y+z&limit=7";
        assert_eq!(provider_query(Some(query), Some(100), true), "limit=100&after=batch_mock_1&x=%20y+z");
        assert_eq!(
            provider_query(Some("purpose=batch&after=file-a%2Bb&order=asc&limit=9"), Some(4), true),
            "purpose=batch&after=file-a%2Bb&order=asc&limit=4"
        );
    }

    #[test]
    fn names_are_read_percent_decoded_as_the_filter_checked_them() {
        // The caller's `limit` given encoded is replaced, not sent beside the page's own.
        assert_eq!(provider_query(Some("l%69mit=2&x=1"), Some(2), false), "limit=2&x=1");
        // A cursor of the gateway's own part, encoded, never reaches the provider.
        assert_eq!(provider_query(Some("%61fter=batch_gw_1&%62efore=b"), Some(5), false), "limit=5");
        assert_eq!(provider_query(Some("%61fter=batch_mock_1"), Some(5), true), "%61fter=batch_mock_1&limit=5");
    }
}
