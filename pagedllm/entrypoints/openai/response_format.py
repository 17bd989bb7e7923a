"""OpenAI's `response_format` and vLLM's `structured_outputs` body field -> the request's
StructuredOutputsParams.

`{"type": "text"}` asks for nothing; `json_object` for any JSON object; `json_schema` for
JSON valid against `json_schema.schema` (always enforced, whatever `strict` says). A
schema is checked here, so a bad one is a 400 naming response_format.
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pagedllm.sampling_params import StructuredOutputsParams
from pagedllm.structured_output import check_grammar


class JsonSchemaResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaResponseFormat | None = None


def structured_outputs_of(
    response_format: ResponseFormat | None, structured_outputs: StructuredOutputsParams | None
) -> StructuredOutputsParams | None:
    """The constraint a request asks for, from either field (not both). ValueError naming
    the field for a missing or invalid schema."""
    if response_format is None or response_format.type == "text":
        return structured_outputs
    if structured_outputs is not None:
        raise ValueError(
            "response_format and structured_outputs both constrain the answer; give only one"
        )
    if response_format.type == "json_object":
        params = StructuredOutputsParams(json_object=True)
    else:
        json_schema = response_format.json_schema
        if json_schema is None or json_schema.json_schema is None:
            raise ValueError(
                'response_format of type "json_schema" needs json_schema.schema (a JSON schema)'
            )
        params = StructuredOutputsParams(json=json_schema.json_schema)
    check_grammar(params, "response_format")
    return params
