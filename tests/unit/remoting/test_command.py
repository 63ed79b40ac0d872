"""RemotingCommand responses and typed extFields access."""

from __future__ import annotations

import pytest

from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import FLAG_ONEWAY, FLAG_RESPONSE, Fields, RemotingCommand, RemotingError


def test_a_response_keeps_the_opaque_and_serialize_type_and_sets_the_response_flag() -> None:
    request = RemotingCommand(RequestCode.GET_MAX_OFFSET, opaque=77, serialize_type=1)
    answer = request.response(ResponseCode.SUCCESS, ext_fields={"offset": "5"})
    assert (answer.opaque, answer.serialize_type, answer.flag) == (77, 1, FLAG_RESPONSE)
    assert answer.is_response and not request.is_response
    assert answer.ext_fields == {"offset": "5"}


def test_oneway_is_read_from_the_flag() -> None:
    assert RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET, flag=FLAG_ONEWAY).is_oneway
    assert not RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET).is_oneway


def test_fields_parse_typed_values_from_strings() -> None:
    fields = Fields({"queueId": "3", "commitOffset": " 9000000000 ", "unitMode": "False"})
    assert fields.integer("queueId") == 3
    assert fields.integer("commitOffset") == 9_000_000_000
    assert fields.boolean("unitMode") is False
    assert fields.boolean("batch") is False
    assert Fields({"batch": "0"}).boolean("batch") is False, "as Boolean.parseBoolean"
    assert Fields({"batch": "TRUE"}).boolean("batch") is True
    assert fields.integer("absent", default=-1) == -1
    assert fields.optional_string("absent") is None


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda f: f.string("topic"), "'topic' is missing"),
        (lambda f: f.integer("queueId"), "'queueId' is not an integer"),
    ],
)
def test_a_missing_or_unparsable_field_is_a_system_error_naming_it(call, message) -> None:  # type: ignore[no-untyped-def]
    fields = Fields({"queueId": "x"})
    with pytest.raises(RemotingError) as caught:
        call(fields)
    assert caught.value.code == ResponseCode.SYSTEM_ERROR
    assert message in caught.value.remark
