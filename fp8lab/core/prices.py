"""Instance prices that say their age: every cost fp8lab prints stands beside the price it used and that price's date.

A price is the assumed default of :data:`fp8lab.core.hardware.DEFAULT_PRICES_USD_PER_HOUR` (with its date, from
``PRICE_AS_OF``), a number the caller gives (``--price-per-hour 60``, ``price_per_hour=60``: the caller's, dated
today's run), or ``lookup``: the on-demand SageMaker training price the AWS Price List API (boto3's ``pricing``
client) returns for the instance type and region, dated by the API's ``effectiveDate``. A lookup that cannot be
made (no boto3, no credentials, no network, no such product) raises :class:`PriceLookupError` saying so and how to
pass a price instead; nothing falls back silently.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Iterable

from fp8lab.core.hardware import DEFAULT_PRICES_USD_PER_HOUR, PRICE_AS_OF, PRICE_SOURCES

LOOKUP = "lookup"  # the override that asks the AWS Price List API
PRICE_CHOICES_TEXT = f"a finite number > 0 (USD per instance-hour) or {LOOKUP!r} (the AWS Price List API)"
# The Price List API answers from us-east-1 (and ap-south-1, eu-central-1), whatever region is priced
PRICING_API_REGION = "us-east-1"
# The product attributes of SageMaker's instance prices, as the SageMaker SDK's own pricing client filters them
# (serviceCode AmazonSageMaker, productFamily "ML Instance", regionCode, instanceName, platoinstancetype)
SERVICE_CODE = "AmazonSageMaker"


class PriceLookupError(ValueError):
    """``--price lookup`` could not get a price (the message says why and what to pass instead)."""


@dataclass(frozen=True)
class Price:
    """USD per instance-hour, the date it holds for and where it comes from."""

    usd_per_hour: float
    as_of: str  # "2024-11", "2026-12-01": when the price was stated or looked up; "given" for the caller's own
    source: str
    instance_type: str | None = None
    region: str | None = None

    @property
    def given(self) -> bool:
        return self.as_of == "given"

    def short(self) -> str:
        """``$113.07/h as of 2024-11``: what stands beside a cost in a table header or a figure title."""
        when = "given by the caller" if self.given else f"as of {self.as_of}"
        return f"${self.usd_per_hour:,.2f}/instance-hour, {when}"

    def text(self) -> str:
        """The price, its date and its source in one sentence part (plans, the verdict, the report)."""
        where = ", ".join(x for x in (self.instance_type, self.region) if x)
        when = "given by the caller" if self.given else f"as of {self.as_of}"
        return f"${self.usd_per_hour:,.2f} per instance-hour ({where + ', ' if where else ''}{when}: {self.source})"


def parse_price(text: Any) -> float | str:
    """A price option's value from text (``--price-per-hour``): a number > 0, or ``lookup``."""
    if isinstance(text, str) and text.strip().lower() == LOOKUP:
        return LOOKUP
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"price {text!r} is invalid; allowed: {PRICE_CHOICES_TEXT}") from None
    if not (0 < value < math.inf):
        raise ValueError(f"price {text!r} is invalid; allowed: {PRICE_CHOICES_TEXT}")
    return value


def price_arg(text: str) -> float | str:
    """``--price-per-hour``'s converter: :func:`parse_price` as argparse reports it (``argument --price-per-hour:
    ...``)."""
    import argparse

    try:
        return parse_price(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: {PRICE_CHOICES_TEXT}") from None


def default_price(instance_type: str) -> Price | None:
    """The assumed default price of an instance type, with its date (None where there is none)."""
    if instance_type not in DEFAULT_PRICES_USD_PER_HOUR:
        return None
    return Price(DEFAULT_PRICES_USD_PER_HOUR[instance_type], PRICE_AS_OF[instance_type], PRICE_SOURCES[instance_type],
                 instance_type, "us-east-1")


def price_of(instance_types: str | Iterable[str], override: Any = None, *, region: str = "us-east-1",
             client: Any = None, name: str = "price_per_hour") -> Price:
    """The price of jobs on ``instance_types`` (one type: prices are per instance type).

    ``override``: None (the assumed default, with its date), a number (the caller's; the default's own number is the
    default, date included), ``"lookup"`` (the AWS Price List API; ``client``: a boto3 ``pricing`` client to use) or a
    :class:`Price` (as it is). ``name``: the caller's parameter, as errors name it."""
    if isinstance(override, Price):
        return override
    types = sorted({instance_types} if isinstance(instance_types, str) else set(instance_types))
    if isinstance(override, str):
        try:
            override = parse_price(override)
        except ValueError:
            raise ValueError(f"{name}={override!r} is invalid; allowed: {PRICE_CHOICES_TEXT}, "
                             "or None (the default)") from None
    if override == LOOKUP:
        if len(types) != 1:
            raise PriceLookupError(f"--price lookup prices one instance type at a time; got {', '.join(types)}")
        return lookup(types[0], region, client=client)
    if override is not None:
        if isinstance(override, bool) or not isinstance(override, (int, float)) or not (0 < override < math.inf):
            raise ValueError(f"{name}={override!r} is invalid; allowed: {PRICE_CHOICES_TEXT}, or None (the default)")
        own = [default_price(t) for t in types]
        if len(own) == 1 and own[0] is not None and own[0].usd_per_hour == float(override):
            return own[0]
        return Price(float(override), "given", "price_per_hour given by the caller",
                     types[0] if len(types) == 1 else None, region if len(types) == 1 else None)
    unknown = [t for t in types if t not in DEFAULT_PRICES_USD_PER_HOUR]
    if unknown or len(types) != 1:
        raise ValueError(f"no default price for {', '.join(unknown or types)}: pass price_per_hour (USD per "
                         f"instance-hour; CLI: --price-per-hour N or --price-per-hour {LOOKUP}); defaults exist for "
                         f"{', '.join(DEFAULT_PRICES_USD_PER_HOUR)}")
    return default_price(types[0])


def lookup(instance_type: str, region: str = "us-east-1", *, client: Any = None) -> Price:
    """The on-demand SageMaker training price of ``instance_type`` in ``region`` from the AWS Price List API."""
    instead = ("pass a price instead (--price-per-hour N, price_per_hour=N; the default: "
               f"{', '.join(DEFAULT_PRICES_USD_PER_HOUR)})")
    if client is None:
        try:
            import boto3
        except ImportError:
            raise PriceLookupError(f"--price lookup needs boto3 (pip install 'fp8lab[aws]'); {instead}") from None
        client = boto3.client("pricing", region_name=PRICING_API_REGION)
    filters = [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in (
        ("regionCode", region), ("instanceName", instance_type), ("platoinstancetype", "Training"))]
    try:
        answer = client.get_products(ServiceCode=SERVICE_CODE, Filters=filters, FormatVersion="aws_v1",
                                     MaxResults=100)
    except Exception as exc:  # noqa: BLE001 - botocore's errors (no credentials, access denied, no network)
        if type(exc).__module__.split(".")[0] != "botocore":
            raise
        first = (str(exc).splitlines() or [""])[0]
        raise PriceLookupError(f"--price lookup: the AWS Price List API could not be asked ({type(exc).__name__}: "
                               f"{first}); {instead}") from None
    found = _on_demand_hourly(answer.get("PriceList") or [])
    if not found:
        raise PriceLookupError(f"--price lookup: the AWS Price List API lists no on-demand SageMaker training price "
                               f"for {instance_type} in {region}; {instead}")
    prices = sorted({usd for usd, _ in found})
    if len(prices) > 1:
        raise PriceLookupError(f"--price lookup: the AWS Price List API lists several on-demand training prices for "
                               f"{instance_type} in {region} ({', '.join(f'${p:,.2f}' for p in prices)}); {instead}")
    date = max(d for _, d in found)
    return Price(prices[0], date, "AWS Price List API, on-demand SageMaker training", instance_type, region)


def _on_demand_hourly(price_list: list) -> list[tuple[float, str]]:
    """(USD per hour, effective date) of every on-demand hourly price dimension in a GetProducts answer."""
    out = []
    for item in price_list:
        product = json.loads(item) if isinstance(item, str) else item
        for term in (product.get("terms", {}).get("OnDemand") or {}).values():
            date = str(term.get("effectiveDate", ""))[:10] or "unknown date"
            for dim in (term.get("priceDimensions") or {}).values():
                usd = (dim.get("pricePerUnit") or {}).get("USD")
                if usd is not None and str(dim.get("unit", "")).lower().startswith("hr") and float(usd) > 0:
                    out.append((float(usd), date))
    return out
