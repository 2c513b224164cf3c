from decimal import Decimal

import pytest

from kubetrain.domain.quantity import QuantityError, format_quantity, parse_quantity

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("500m", Decimal("0.5")),
        ("16Gi", Decimal(16 * 1024**3)),
        ("1e3", Decimal(1000)),
        ("1E-2", Decimal("0.01")),
        ("2k", Decimal(2000)),
        ("1.5Ki", Decimal(1536)),
        ("8", Decimal(8)),
        (8, Decimal(8)),
        ("+4", Decimal(4)),
        (".5", Decimal("0.5")),
        ("100n", Decimal("0.0000001")),
        ("3Ei", Decimal(3 * 1024**6)),
    ],
)
def test_parses_like_the_api_server(text, expected):
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    "text", ["", "abc", "16GB", "1.2.3", "5 Gi", "1e999", "Gi", True, "1" * 65]
)
def test_refuses_what_the_api_server_refuses(text):
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_error_says_what_is_allowed():
    with pytest.raises(QuantityError, match=r"suffix \(n, u, m, k"):
        parse_quantity("16GB")


def test_milli_sums_are_exact():
    assert parse_quantity("500m") + parse_quantity("500m") == parse_quantity("1")


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Decimal(16 * 1024**3), "16Gi"),
        (Decimal("0.5"), "500m"),
        (Decimal(8), "8"),
        (Decimal(1536), "1536"),
        (Decimal(3 * 1024**2), "3Mi"),
        # Whole multiples of ten keep their zeros (quota-several.json: 60Gi in use).
        (Decimal(60 * 1024**3), "60Gi"),
        (Decimal(100 * 1024**2), "100Mi"),
        (Decimal(1024**4), "1Ti"),
    ],
)
def test_format(value, text):
    assert format_quantity(value) == text


@pytest.mark.parametrize("text", ["999999999999999999999999Ei", "9223372036854775808", "8Ei"])
def test_refuses_a_quantity_past_int64_as_apimachinery_does(text):
    with pytest.raises(QuantityError, match="out of range"):
        parse_quantity(text)


def test_the_largest_quantity_is_accepted():
    assert parse_quantity("9223372036854775807") == Decimal(2**63 - 1)
