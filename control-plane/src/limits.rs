//! Limits, prices and usage (issue 26): `PUT`/`GET`/`DELETE /v1/limits/{id}`, `GET /v1/limits`,
//! `PUT`/`GET /v1/prices/{model}` and `GET /v1/usage`; and what the filter reads of them,
//! `GET /internal/v1/workspaces/{workspace}/policy`, and asks of them, `POST /internal/v1/leases`
//! (the ledger: `ledger` decides, `db::limits` locks and records).

use crate::auth::{self, Caller};
use crate::db::limits::{Answer, Ask, Occupancy, Report, StoredLimit};
use crate::db::logs::UsageKey;
use crate::db::{now_ms, now_s};
use crate::errors::{ApiError, ApiResult};
use crate::lists::list_json;
use crate::logs::seconds;
use crate::validate::{is_name, json_object, query_pairs, unknown_field, Path, WholeBody, MAX_WORKSPACE};
use crate::AppState;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Json;
use gateway_schema::limits::{parse_limit, Limit, LimitKind, Policy, Scope};
use gateway_schema::prices::{parse_price, Catalog, Price};
use serde_json::{json, Map, Value};
use std::sync::OnceLock;

/// Limit ids: `[A-Za-z0-9._-]`, 1..=128 characters.
pub const MAX_LIMIT_ID: usize = 128;
/// Model names in a price's path: 1..=256 characters.
pub const MAX_MODEL: usize = 256;
/// At most this many asks, and this many reports, in one lease call.
pub const MAX_LEASE_ITEMS: usize = 1000;
/// Lease ids (the control plane's UUIDs) in reports: 1..=128 characters.
const MAX_LEASE_ID: usize = 128;

/// A schema parser's error (the field at fault, empty for the body, and why) as a 400.
fn field_error((field, message): (String, String)) -> ApiError {
    ApiError::invalid(if field.is_empty() { "body" } else { &field }, &message)
}

fn unknown_parameter(name: &str, known: &str) -> ApiError {
    ApiError::invalid(name, &format!("unknown parameter `{name}` (parameters: {known})"))
}

/// A workspace name given as `workspace`, else a 400 naming it.
fn workspace_name(name: &str) -> ApiResult<String> {
    if is_name(name, MAX_WORKSPACE) {
        Ok(name.to_string())
    } else {
        Err(ApiError::invalid(
            "workspace",
            &format!("workspace must be 1 to {MAX_WORKSPACE} characters from [A-Za-z0-9._-]"),
        ))
    }
}

/// The workspace a call acts on: the caller's, or (`?workspace=`) another one for an admin key.
pub(crate) fn acting_workspace(caller: &Caller, requested: Option<&str>) -> ApiResult<String> {
    let Some(name) = requested else { return Ok(caller.workspace.clone()) };
    let name = workspace_name(name)?;
    if name != caller.workspace {
        caller.require_admin()?;
    }
    Ok(name)
}

/// `?workspace=` and nothing else.
pub(crate) fn workspace_parameter(pairs: &[(String, String)]) -> ApiResult<Option<&str>> {
    let mut workspace = None;
    for (name, value) in pairs {
        match name.as_str() {
            "workspace" if workspace.is_none() => workspace = Some(value.as_str()),
            "workspace" => return Err(ApiError::invalid(name, "workspace is given more than once")),
            other => return Err(unknown_parameter(other, "workspace")),
        }
    }
    Ok(workspace)
}

// ---- limits ----

/// A limit as answered: its fields, `created_at`, `updated_at`, and `usage` when read alone.
fn limit_json(stored: &StoredLimit, usage: Option<Occupancy>) -> ApiResult<Value> {
    let mut out = match serde_json::to_value(&stored.limit) {
        Ok(Value::Object(map)) => map,
        Ok(_) => Map::new(),
        Err(e) => return Err(ApiError::internal(format!("a limit as JSON: {e}"))),
    };
    out.insert("created_at".into(), json!(stored.created_at));
    out.insert("updated_at".into(), json!(stored.updated_at));
    if let Some(usage) = usage {
        out.insert(
            "usage".into(),
            json!({"requests": usage.requests, "tokens": usage.tokens,
                "spent_usd": usd(usage.spent_micro_usd), "period_start": usage.period_start,
                "reserved": {"requests": usage.reserved[0], "tokens": usage.reserved[1],
                             "usd": usd(usage.reserved[2])}}),
        );
    }
    Ok(Value::Object(out))
}

fn usd(micro_usd: i64) -> f64 {
    micro_usd as f64 / 1e6
}

/// `PUT /v1/limits/{id}` (admin keys): creates or replaces the limit.
pub async fn put_limit(
    State(s): State<AppState>,
    h: HeaderMap,
    Path(id): Path<String>,
    WholeBody(body): WholeBody,
) -> ApiResult<Json<Value>> {
    auth::caller(&s, &h).await?.require_admin()?;
    let limit = limit_request(&id, &body)?;
    let workspace = match &limit.scope {
        Scope::Workspace(name) => name.clone(),
        Scope::ApiKeyId(key) => s.db.key_workspace(key).await?.ok_or_else(|| {
            ApiError::invalid("api_key_id", "api_key_id names no API key (give an id from POST /v1/api-keys)")
        })?,
    };
    let stored = s.db.put_limit(&workspace, &limit).await?;
    Ok(Json(limit_json(&stored, None)?))
}

/// The limit a `PUT /v1/limits/{id}` makes of its path id and body, every field checked (the
/// workspace it names too; a key it names is looked up by the handler).
pub(crate) fn limit_request(id: &str, body: &[u8]) -> ApiResult<Limit> {
    if !is_name(id, MAX_LIMIT_ID) {
        return Err(ApiError::invalid(
            "id",
            &format!("a limit id is 1 to {MAX_LIMIT_ID} characters from [A-Za-z0-9._-]"),
        ));
    }
    let limit = parse_limit(id, &Value::Object(json_object(body)?)).map_err(field_error)?;
    if let Scope::Workspace(name) = &limit.scope {
        workspace_name(name)?;
    }
    Ok(limit)
}

/// A limit the caller may read: any for an admin key, else one of its workspace.
async fn readable_limit(s: &AppState, caller: &Caller, id: &str) -> ApiResult<StoredLimit> {
    match s.db.limit(id).await? {
        Some(stored) if caller.admin || stored.workspace == caller.workspace => Ok(stored),
        _ => Err(ApiError::not_found("limit")),
    }
}

/// `GET /v1/limits/{id}`: the limit and what its ledger holds now.
pub async fn get_limit(State(s): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    let caller = auth::caller(&s, &h).await?;
    let stored = readable_limit(&s, &caller, &id).await?;
    let usage = s.db.occupancy(&stored.limit, now_ms()).await?;
    Ok(Json(limit_json(&stored, Some(usage))?))
}

/// `GET /v1/limits`: the limits of the caller's workspace (admin keys: of every workspace).
pub async fn list_limits(State(s): State<AppState>, h: HeaderMap) -> ApiResult<Response> {
    let caller = auth::caller(&s, &h).await?;
    let workspace = (!caller.admin).then_some(caller.workspace.as_str());
    let limits = s.db.limits(workspace).await?;
    let data = limits.iter().map(|stored| limit_json(stored, None)).collect::<ApiResult<Vec<Value>>>()?;
    Ok(list_json(data, false))
}

/// `DELETE /v1/limits/{id}` (admin keys): the limit and its ledger.
pub async fn delete_limit(State(s): State<AppState>, h: HeaderMap, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    auth::caller(&s, &h).await?.require_admin()?;
    if !s.db.delete_limit(&id).await? {
        return Err(ApiError::not_found("limit"));
    }
    Ok(Json(json!({"id": id, "deleted": true})))
}

// ---- prices ----

fn catalog() -> &'static Catalog {
    static CATALOG: OnceLock<Catalog> = OnceLock::new();
    CATALOG.get_or_init(Catalog::shipped)
}

/// A model named in a price's path: `[A-Za-z0-9._:@/-]`, 1..=256 characters.
pub(crate) fn model_name(model: &str) -> ApiResult<&str> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"._:@/-".contains(&b);
    if (1..=MAX_MODEL).contains(&model.len()) && model.bytes().all(allowed) {
        Ok(model)
    } else {
        Err(ApiError::invalid("model", &format!("a model name is 1 to {MAX_MODEL} characters from [A-Za-z0-9._:@/-]")))
    }
}

/// The body of a `PUT /v1/prices/{model}`: a price, every field checked.
pub(crate) fn price_body(body: &[u8]) -> ApiResult<Price> {
    parse_price(&Value::Object(json_object(body)?)).map_err(field_error)
}

fn price_json(model: &str, price: &Price, source: &str, date: Option<&str>) -> ApiResult<Value> {
    let mut out = Map::new();
    out.insert("model".into(), json!(model));
    match serde_json::to_value(price) {
        Ok(Value::Object(fields)) => out.extend(fields),
        Ok(_) => {}
        Err(e) => return Err(ApiError::internal(format!("a price as JSON: {e}"))),
    }
    out.insert("source".into(), json!(source));
    if let Some(date) = date {
        out.insert("date".into(), json!(date));
    }
    Ok(Value::Object(out))
}

/// `PUT /v1/prices/{model}`: the price of `model` for the caller's workspace (admin keys:
/// `?workspace=` another one), over the catalog's.
pub async fn put_price(
    State(s): State<AppState>,
    h: HeaderMap,
    Path(model): Path<String>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
    WholeBody(body): WholeBody,
) -> ApiResult<Json<Value>> {
    let caller = auth::caller(&s, &h).await?;
    let pairs = query_pairs(query)?;
    let workspace = acting_workspace(&caller, workspace_parameter(&pairs)?)?;
    let model = model_name(&model)?;
    // Budgets are held at these prices: a workspace's own keys price what the catalog does not,
    // and only an admin key sets a price over the catalog's (else a team could spend past its
    // budget by pricing its models at nothing).
    if !caller.admin && catalog().price(model).is_some() {
        let message = format!("the catalog prices {model}: a workspace's price over it is set with an admin key");
        return Err(ApiError::forbidden(&message));
    }
    let price = price_body(&body)?;
    let text = serde_json::to_string(&price).map_err(ApiError::internal)?;
    s.db.put_price(&workspace, model, &text).await?;
    Ok(Json(price_json(model, &price, "workspace", None)?))
}

/// `GET /v1/prices/{model}`: the workspace's price, else the catalog's with its date, else 404.
pub async fn get_price(
    State(s): State<AppState>,
    h: HeaderMap,
    Path(model): Path<String>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> ApiResult<Json<Value>> {
    let caller = auth::caller(&s, &h).await?;
    let pairs = query_pairs(query)?;
    let workspace = acting_workspace(&caller, workspace_parameter(&pairs)?)?;
    let model = model_name(&model)?;
    if let Some(text) = s.db.price(&workspace, model).await? {
        let price: Price = serde_json::from_str(&text).map_err(ApiError::internal)?;
        return Ok(Json(price_json(model, &price, "workspace", None)?));
    }
    match catalog().price(model) {
        Some((price, date)) => Ok(Json(price_json(model, &price, "catalog", Some(date))?)),
        None => Err(ApiError::not_found("price (neither the workspace nor the catalog has one for this model)")),
    }
}

// ---- usage ----

/// `GET /v1/usage?start=&end=&group_by=...`: the caller's workspace's request records with
/// `start <= time < end` (Unix s; default 0 and now; admin keys: `?workspace=` another one),
/// added up per group, sorted by the groups' values.
pub async fn usage(
    State(s): State<AppState>,
    h: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> ApiResult<Json<Value>> {
    let caller = auth::caller(&s, &h).await?;
    let pairs = query_pairs(query)?;
    let UsageQuery { start, end, workspace, group } = usage_query(&pairs, now_s())?;
    let workspace = acting_workspace(&caller, workspace)?;
    let rows = s.db.usage(&workspace, start * 1000, end * 1000, &group).await?;
    let data: Vec<Value> = rows
        .into_iter()
        .map(|row| {
            let mut out = Map::new();
            for (key, value) in group.iter().zip(row.keys) {
                out.insert(key.name().into(), json!(value));
            }
            out.insert("requests".into(), json!(row.requests));
            out.insert("input_tokens".into(), json!(row.input_tokens));
            out.insert("output_tokens".into(), json!(row.output_tokens));
            out.insert("cost_usd".into(), json!(usd(row.cost_micro_usd)));
            Value::Object(out)
        })
        .collect();
    Ok(Json(json!({"object": "list", "data": data, "has_more": false, "start": start, "end": end})))
}

/// A usage query's parameters.
pub(crate) struct UsageQuery<'a> {
    pub start: i64,
    pub end: i64,
    pub workspace: Option<&'a str>,
    pub group: Vec<UsageKey>,
}

/// What `GET /v1/usage` asks: its period (`now`: the end when none is given), the workspace it
/// names (the caller's own unless an admin names another) and its groups; a parameter unknown,
/// given twice or not valid is a 400 naming it.
pub(crate) fn usage_query(pairs: &[(String, String)], now: i64) -> ApiResult<UsageQuery<'_>> {
    let (mut start, mut end, mut workspace, mut group) = (None, None, None, Vec::new());
    for (name, value) in pairs {
        let once = |seen: bool| {
            if seen {
                Err(ApiError::invalid(name, &format!("{name} is given more than once")))
            } else {
                Ok(())
            }
        };
        match name.as_str() {
            "start" => {
                once(start.is_some())?;
                start = Some(seconds(name, value)?);
            }
            "end" => {
                once(end.is_some())?;
                end = Some(seconds(name, value)?);
            }
            "workspace" => {
                once(workspace.is_some())?;
                workspace = Some(value.as_str());
            }
            "group_by" => {
                let key = UsageKey::ALL
                    .into_iter()
                    .find(|k| k.name() == value)
                    .ok_or_else(|| ApiError::invalid(name, "group_by must be model, api_key, workspace or provider"))?;
                if !group.contains(&key) {
                    group.push(key);
                }
            }
            other => return Err(unknown_parameter(other, "start, end, group_by, workspace")),
        }
    }
    let (start, end) = (start.unwrap_or(0), end.unwrap_or(now));
    if start > end {
        return Err(ApiError::invalid("start", "start must not be after end"));
    }
    Ok(UsageQuery { start, end, workspace, group })
}

// ---- internal: the filter's policy and leases ----

/// `GET /internal/v1/workspaces/{workspace}/policy`: the workspace's limits (its own and its
/// keys') and prices, as `Policy`; always 200.
pub async fn policy(State(s): State<AppState>, h: HeaderMap, Path(workspace): Path<String>) -> ApiResult<Json<Value>> {
    auth::internal(&s, &h)?;
    let mut policy = Policy::default();
    if is_name(&workspace, MAX_WORKSPACE) {
        policy.limits = s.db.limits(Some(&workspace)).await?.into_iter().map(|stored| stored.limit).collect();
        for (model, text) in s.db.prices(&workspace).await? {
            policy.prices.insert(model, serde_json::from_str(&text).map_err(ApiError::internal)?);
        }
    }
    Ok(Json(serde_json::to_value(policy).map_err(ApiError::internal)?))
}

/// `POST /internal/v1/leases`: `{"grants": [{"limit", "kind", "need", "want"}], "reports":
/// [{"lease", "used"}]}` → `{"grants": [{"limit", "kind", "lease", "granted", "ttl_ms", "bound",
/// "remaining", "reset_s", "retry_ms"?}]}` in the order asked (`"gone": true` for a limit that is no more, or
/// no longer bounds that kind). Reports are applied first.
pub async fn leases(State(s): State<AppState>, h: HeaderMap, WholeBody(body): WholeBody) -> ApiResult<Json<Value>> {
    auth::internal(&s, &h)?;
    let (asks, reports) = lease_call(&json_object(&body)?)?;
    let answers = s.db.lease(&asks, &reports, now_ms).await?;
    Ok(Json(json!({"grants": answers.iter().map(answer_json).collect::<Vec<_>>()})))
}

fn answer_json(answer: &Answer) -> Value {
    let (limit, kind) = (&answer.ask.limit, answer.ask.kind.as_str());
    match &answer.granted {
        Some(g) => {
            let mut answer = json!({"limit": limit, "kind": kind, "lease": g.lease, "granted": g.decision.granted,
                "ttl_ms": g.decision.ttl_ms, "bound": g.bound, "remaining": g.decision.remaining,
                "reset_s": g.decision.reset_s});
            if let (Some(retry_ms), Some(fields)) = (g.decision.retry_ms, answer.as_object_mut()) {
                fields.insert("retry_ms".into(), retry_ms.into());
            }
            answer
        }
        None => json!({"limit": limit, "kind": kind, "lease": null, "granted": 0, "ttl_ms": 0, "bound": 0,
            "remaining": 0, "reset_s": 0, "gone": true}),
    }
}

/// The asks and reports of a lease call; every field checked, a 400 naming it
/// (`grants[2].need`).
pub(crate) fn lease_call(body: &Map<String, Value>) -> ApiResult<(Vec<Ask>, Vec<Report>)> {
    if let Some(key) = body.keys().find(|k| !["grants", "reports"].contains(&k.as_str())) {
        return Err(unknown_field("", key, " (a lease call has grants and reports)"));
    }
    let asks = items(body, "grants")?
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let at = format!("grants[{i}]");
            let fields = fields_of(item, &at, &["limit", "kind", "need", "want"])?;
            let limit = text(fields, &at, "limit", MAX_NAME)?;
            let kind = fields
                .get("kind")
                .and_then(|v| serde_json::from_value::<LimitKind>(v.clone()).ok())
                .ok_or_else(|| ApiError::invalid(&format!("{at}.kind"), "kind must be requests, tokens or budget"))?;
            let need = count(fields, &at, "need")?.ok_or_else(|| required(&at, "need"))?;
            let want = count(fields, &at, "want")?.unwrap_or(need);
            Ok(Ask { limit, kind, need, want })
        })
        .collect::<ApiResult<Vec<Ask>>>()?;
    let reports = items(body, "reports")?
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let at = format!("reports[{i}]");
            let fields = fields_of(item, &at, &["lease", "used", "uses"])?;
            let lease = text(fields, &at, "lease", MAX_LEASE_ID)?;
            let used = count(fields, &at, "used")?.ok_or_else(|| required(&at, "used"))?;
            let uses = uses(fields.get("uses"), &format!("{at}.uses"), used)?;
            Ok(Report { lease, used, uses })
        })
        .collect::<ApiResult<Vec<Report>>>()?;
    Ok((asks, reports))
}

/// A report's uses by admission (absent: none): at most `MAX_REPORTED_USES` `[offset_ms, amount]`
/// pairs of integers, not negative, whose amounts add up to no more than `used`.
fn uses(value: Option<&Value>, at: &str, used: i64) -> ApiResult<Vec<(i64, i64)>> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    let shape = || {
        ApiError::invalid(
            at,
            &format!(
                "uses must be an array of at most {MAX_REPORTED_USES} [offset_ms, amount] pairs of integers, not negative"
            ),
        )
    };
    let items = value.as_array().filter(|items| items.len() <= MAX_REPORTED_USES).ok_or_else(shape)?;
    let integer = |v: &Value| v.as_u64().and_then(|n| i64::try_from(n).ok());
    let uses = items
        .iter()
        .map(|pair| match pair.as_array().map(Vec::as_slice) {
            Some([offset, amount]) => Some((integer(offset)?, integer(amount)?)),
            _ => None,
        })
        .collect::<Option<Vec<(i64, i64)>>>()
        .ok_or_else(shape)?;
    if uses.iter().fold(0i64, |sum, (_, amount)| sum.saturating_add(*amount)) > used {
        return Err(ApiError::invalid(at, "uses add up to more than used"));
    }
    Ok(uses)
}

/// Uses by admission in one report: a lease lives 5 s and the filter reports its uses by 100 ms.
const MAX_REPORTED_USES: usize = 1000;

/// Limit ids as a lease call names them (an id nobody has is answered `gone`).
const MAX_NAME: usize = 256;

fn required(at: &str, field: &str) -> ApiError {
    ApiError::invalid(&format!("{at}.{field}"), &format!("{field} is required"))
}

/// The array `name` of a lease call (absent: none), at most `MAX_LEASE_ITEMS` long.
fn items<'a>(body: &'a Map<String, Value>, name: &str) -> ApiResult<&'a [Value]> {
    match body.get(name) {
        None => Ok(&[]),
        Some(Value::Array(items)) if items.len() <= MAX_LEASE_ITEMS => Ok(items),
        Some(Value::Array(_)) => Err(ApiError::invalid(name, &format!("at most {MAX_LEASE_ITEMS} {name} per call"))),
        Some(_) => Err(ApiError::invalid(name, &format!("{name} must be an array"))),
    }
}

/// An item's object, with only `known` fields.
fn fields_of<'a>(item: &'a Value, at: &str, known: &[&str]) -> ApiResult<&'a Map<String, Value>> {
    let fields = item.as_object().ok_or_else(|| ApiError::invalid(at, &format!("{at} must be an object")))?;
    match fields.keys().find(|k| !known.contains(&k.as_str())) {
        Some(key) => Err(unknown_field(at, key, "")),
        None => Ok(fields),
    }
}

fn text(fields: &Map<String, Value>, at: &str, field: &str, max: usize) -> ApiResult<String> {
    match fields.get(field) {
        Some(Value::String(text)) if (1..=max).contains(&text.len()) => Ok(text.clone()),
        Some(_) => {
            Err(ApiError::invalid(&format!("{at}.{field}"), &format!("{field} must be a string of 1 to {max} bytes")))
        }
        None => Err(required(at, field)),
    }
}

/// A count (an integer, not negative; at most 2^63 - 1), when given.
fn count(fields: &Map<String, Value>, at: &str, field: &str) -> ApiResult<Option<i64>> {
    match fields.get(field) {
        None => Ok(None),
        Some(v) => v.as_u64().and_then(|n| i64::try_from(n).ok()).map(Some).ok_or_else(|| {
            ApiError::invalid(&format!("{at}.{field}"), &format!("{field} must be an integer, not negative"))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param<T: std::fmt::Debug>(r: ApiResult<T>) -> String {
        let e = r.unwrap_err().0;
        assert_eq!(e.status, 400);
        e.param().unwrap()
    }

    fn call(body: Value) -> ApiResult<(Vec<Ask>, Vec<Report>)> {
        lease_call(body.as_object().unwrap())
    }

    #[test]
    fn lease_calls_check_every_field() {
        let (asks, reports) = call(json!({"grants": [{"limit": "l", "kind": "tokens", "need": 5, "want": 50},
            {"limit": "m", "kind": "budget", "need": 7}], "reports": [{"lease": "x", "used": 0}]}))
        .unwrap();
        assert_eq!(
            asks,
            [
                Ask { limit: "l".into(), kind: LimitKind::Tokens, need: 5, want: 50 },
                Ask { limit: "m".into(), kind: LimitKind::Budget, need: 7, want: 7 }
            ]
        );
        assert_eq!(reports, [Report { lease: "x".into(), used: 0, uses: vec![] }]);
        assert_eq!(call(json!({})).unwrap(), (vec![], vec![]));
        let ask = |field: &str, value: Value| {
            let mut a = json!({"limit": "l", "kind": "requests", "need": 1, "want": 1});
            a[field] = value;
            param(call(json!({"grants": [{"limit": "ok", "kind": "requests", "need": 1}, a]})))
        };
        assert_eq!(ask("limit", json!("")), "grants[1].limit");
        assert_eq!(ask("limit", json!(7)), "grants[1].limit");
        assert_eq!(ask("kind", json!("cost")), "grants[1].kind");
        assert_eq!(ask("need", json!(-1)), "grants[1].need");
        assert_eq!(ask("need", json!(1.5)), "grants[1].need");
        assert_eq!(ask("want", json!(u64::MAX)), "grants[1].want");
        assert_eq!(ask("extra", json!(1)), "grants[1].extra");
        assert_eq!(param(call(json!({"grants": [{"limit": "l", "kind": "requests"}]}))), "grants[0].need");
        assert_eq!(param(call(json!({"grants": [1]}))), "grants[0]");
        assert_eq!(param(call(json!({"grants": {}}))), "grants");
        assert_eq!(
            param(call(json!({"grants": vec![json!({"limit": "l", "kind": "requests", "need": 1}); 1001]}))),
            "grants"
        );
        assert_eq!(param(call(json!({"reports": [{"lease": "x"}]}))), "reports[0].used");
        assert_eq!(param(call(json!({"reports": [{"lease": "", "used": 1}]}))), "reports[0].lease");
        assert_eq!(param(call(json!({"reports": [{"used": 1}]}))), "reports[0].lease");
        assert_eq!(param(call(json!({"renew": []}))), "renew");
        let uses = |uses: Value| call(json!({"reports": [{"lease": "x", "used": 5, "uses": uses}]}));
        assert_eq!(uses(json!([[4900, 3], [100, 2]])).unwrap().1[0].uses, [(4900, 3), (100, 2)]);
        for bad in [json!({}), json!([[1]]), json!([[1, 2, 3]]), json!([[-1, 1]]), json!([[1, 1.5]]), json!([[0, 6]])] {
            assert_eq!(param(uses(bad.clone())), "reports[0].uses", "{bad}");
        }
        assert_eq!(param(uses(json!(vec![json!([0, 0]); 1001]))), "reports[0].uses");
    }

    #[test]
    fn price_paths_name_models() {
        for ok in
            ["gpt-4o", "claude-sonnet-4-5@20250929", "us.anthropic.claude-sonnet-4-5-20250929-v1:0", "org/model_1"]
        {
            assert_eq!(model_name(ok).unwrap(), ok);
        }
        for bad in ["", "a b", "é", &"m".repeat(257)] {
            assert_eq!(param(model_name(bad)), "model", "{bad}");
        }
    }
}
