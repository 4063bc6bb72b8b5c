"""The API's error codes and the HTTP status of each. Generated from the daemon's
`api_types::ErrorCode` by `SANDFORK_BLESS=1 cargo test -p sandfork-api-types
error_codes`: do not edit."""

from typing import Dict

ERROR_STATUS: Dict[str, int] = {
    "bad_request": 400,
    "invalid_argument": 400,
    "exec_failed": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "timed_out": 408,
    "conflict": 409,
    "too_large": 413,
    "unsupported": 422,
    "over_capacity": 429,
    "internal": 500,
    "runtime_error": 500,
    "bad_gateway": 502,
    "registry_error": 502,
    "integrity": 502,
    "unavailable": 503,
    "insufficient_storage": 507,
}
