"""Prices that say their age: the assumed default with its date, a caller's number, and ``lookup`` through boto3's
``pricing`` client (botocore's Stubber answers GetProducts: nothing leaves the process), refused clearly when it
cannot be made; every view quotes the price beside its costs, from one function."""
from __future__ import annotations

import json

import pytest

from fp8lab import analysis
from fp8lab.analysis.estimates import price_words
from fp8lab.core import prices
from fp8lab.core.prices import LOOKUP, Price, PriceLookupError, lookup, parse_price, price_of

boto3 = pytest.importorskip("boto3")
from botocore.stub import Stubber  # noqa: E402


def _client():
    return boto3.client("pricing", region_name="us-east-1", aws_access_key_id="stub", aws_secret_access_key="stub")


def _product(usd: str, date: str = "2025-06-01T00:00:00Z", instance: str = "ml.p5.48xlarge") -> str:
    """One SageMaker training product of a GetProducts answer, in the Price List API's aws_v1 format."""
    sku = "SKUEXAMPLE1"
    return json.dumps({
        "product": {"productFamily": "ML Instance", "sku": sku, "attributes": {
            "servicecode": "AmazonSageMaker", "regionCode": "us-east-1", "instanceName": instance,
            "platoinstancetype": "Training", "usagetype": f"USE1-Train:{instance}"}},
        "serviceCode": "AmazonSageMaker",
        "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": {
            "sku": sku, "effectiveDate": date, "offerTermCode": "JRTCKXETXF", "termAttributes": {},
            "priceDimensions": {f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                "unit": "Hrs", "pricePerUnit": {"USD": usd}, "description": f"${usd} per {instance} training hour",
                "rateCode": f"{sku}.JRTCKXETXF.6YS6EN2CT7", "beginRange": "0", "endRange": "Inf", "appliesTo": []}}}}},
        "version": "20250601000000", "publicationDate": "2025-06-01T00:00:00Z"})


EXPECTED = {"ServiceCode": "AmazonSageMaker", "FormatVersion": "aws_v1", "MaxResults": 100, "Filters": [
    {"Type": "TERM_MATCH", "Field": "regionCode", "Value": "us-east-1"},
    {"Type": "TERM_MATCH", "Field": "instanceName", "Value": "ml.p5.48xlarge"},
    {"Type": "TERM_MATCH", "Field": "platoinstancetype", "Value": "Training"}]}


def test_the_default_price_says_its_date_and_source():
    p = price_of("ml.p5.48xlarge")
    assert (p.usd_per_hour, p.as_of, p.instance_type) == (113.07, "2024-11", "ml.p5.48xlarge")
    assert p.short() == "$113.07/instance-hour, as of 2024-11"
    assert "as of 2024-11" in p.text() and "assumed" in p.text() and "2025" in p.text()  # says the cut came later
    assert price_of("ml.p5.48xlarge", 113.07) == p  # the default's own number is the default, date included
    given = price_of("ml.p5.48xlarge", 60)
    assert given.usd_per_hour == 60 and given.given and given.short() == "$60.00/instance-hour, given by the caller"
    assert price_of("ml.p5.4xlarge").usd_per_hour == round(113.07 / 8, 2)  # one of P5's 8 GPUs, assumed
    assert price_words() == p.short() and price_words(60) == given.short() and price_words(full=True) == p.text()
    assert parse_price("60") == 60.0 and parse_price(" Lookup ") == LOOKUP
    for bad in ("0", "-3", "nan", "inf", "cheap", None):
        with pytest.raises(ValueError, match="allowed: a finite number > 0 .* or 'lookup'"):
            parse_price(bad)
    with pytest.raises(ValueError, match="no default price for ml.p5e.48xlarge: pass price_per_hour .*lookup"):
        price_of("ml.p5e.48xlarge")


def test_lookup_reads_the_on_demand_training_price_and_its_date():
    client = _client()
    with Stubber(client) as stub:
        stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [_product("55.04")]}, EXPECTED)
        p = price_of("ml.p5.48xlarge", "lookup", client=client)
        stub.assert_no_pending_responses()
    assert (p.usd_per_hour, p.as_of, p.region) == (55.04, "2025-06-01", "us-east-1")
    assert p.short() == "$55.04/instance-hour, as of 2025-06-01" and "AWS Price List API" in p.text()


def test_lookup_says_when_it_cannot(monkeypatch):
    client = _client()
    with Stubber(client) as stub:
        stub.add_client_error("get_products", "AccessDeniedException", "not allowed to call pricing:GetProducts")
        with pytest.raises(PriceLookupError, match=r"could not be asked \(AccessDeniedException: .*pass a price instead"):
            lookup("ml.p5.48xlarge", client=client)
        stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": []}, EXPECTED)
        with pytest.raises(PriceLookupError, match="lists no on-demand SageMaker training price for ml.p5.48xlarge in us-east-1"):
            lookup("ml.p5.48xlarge", client=client)
        stub.add_response("get_products", {"FormatVersion": "aws_v1",
                                           "PriceList": [_product("55.04"), _product("60.00")]}, EXPECTED)
        with pytest.raises(PriceLookupError, match=r"several on-demand training prices .*\$55.04, \$60.00"):
            lookup("ml.p5.48xlarge", client=client)
    with pytest.raises(PriceLookupError, match="one instance type at a time"):
        price_of(["ml.p5.48xlarge", "ml.p5e.48xlarge"], "lookup")
    # no credentials anywhere: the real client refuses before any network call, and the command says so in one line
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", raising=False)
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", raising=False)
    with pytest.raises(PriceLookupError, match="NoCredentialsError"):
        lookup("ml.p5.48xlarge")


def test_launch_plan_takes_a_looked_up_price_and_prints_its_date(capsys, monkeypatch):
    from fp8lab import launch as L
    from fp8lab.launch import cli

    client = _client()
    with Stubber(client) as stub:
        stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [_product("55.04")]}, EXPECTED)
        looked = lookup("ml.p5.48xlarge", client=client)
    plan = L.plan_sweep(["llama-1b"], ["bf16", "fp8"], [1], role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET,
                        tokens=24 * 10**9, price_per_hour=looked)
    default = L.plan_sweep(["llama-1b"], ["bf16", "fp8"], [1], role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET,
                           tokens=24 * 10**9)
    assert plan.summary()["price_as_of"] == "2025-06-01" and default.summary()["price_as_of"] == "2024-11"
    assert plan.total_cost_usd == pytest.approx(default.total_cost_usd * 55.04 / 113.07)
    assert "price: $55.04 per instance-hour (ml.p5.48xlarge, us-east-1, as of 2025-06-01" in L.format_cost_table(plan)
    # the command: lookup through the same function, with the stubbed client the Price List API would be
    monkeypatch.setattr(prices, "lookup", lambda t, region="us-east-1", client=None: looked)
    assert cli.main(["plan", "--models", "llama-1b", "--instance-counts", "1", "--price", "lookup"]) == 0
    assert "as of 2025-06-01" in capsys.readouterr().out


def test_the_price_override_changes_every_view_s_costs_by_its_ratio():
    """--price-per-hour 60: every cost of the answer (README, notebook 05, the verdict, the report) by 60/113.07,
    each beside the price it used; the default's costs beside the default price and its date."""
    from fp8lab.views.report import headline_markdown

    from fp8lab.analysis.index import committed_summary

    summary = committed_summary()
    a = analysis.Answer.of(summary)
    b = analysis.Answer.of(summary, price_per_instance_hour=60)
    priced = a.rows["cost_fp8"].notna()
    assert priced.sum() >= 3
    for col in ("cost_bf16", "cost_fp8"):
        assert (b.rows[col][priced] / a.rows[col][priced]).tolist() == pytest.approx([60 / 113.07] * priced.sum())
    assert (b.costs()["cost_usd"] / a.costs()["cost_usd"]).tolist() == pytest.approx([60 / 113.07] * len(a.costs()))
    assert "24B tokens on one P5 at $113.07/instance-hour, as of 2024-11: BF16 -> FP8" in headline_markdown(a.rows, a.tokens, a.price)
    assert "at $60.00/instance-hour, given by the caller: BF16 -> FP8" in headline_markdown(b.rows, b.tokens, b.price)
    assert "at $113.07/instance-hour, as of 2024-11" in a.verdict() and "at $60.00/instance-hour" in b.verdict()
    assert set(a.costs()["price_note"]) == {"$113.07/instance-hour, as of 2024-11"}
    costs = analysis.cost_table(summary, price_per_instance_hour=60, estimate=b.estimate)
    assert set(costs["price_note"]) == {"$60.00/instance-hour, given by the caller"}
    with pytest.raises(ValueError, match="price_per_instance_hour='cheap' is invalid"):
        analysis.Answer.of(summary, price_per_instance_hour="cheap")
    assert isinstance(a.price, Price) and a.price.as_of == "2024-11"
