from lightning_granndis.ledger import CommLedger


def test_book_totals_since_and_roundtrip():
    led = CommLedger()
    led.book("inter", "grad_sync", nbytes=100, messages=2, seconds=0.5, modelled_seconds=0.25)
    mark = led.snapshot()
    led.book("inter", "grad_sync", nbytes=50, messages=1, seconds=0.1)
    led.book("intra", "halo", nbytes=7, messages=1)
    assert led.get("inter", "grad_sync").bytes == 150
    assert led.total(link="inter").messages == 3
    assert led.total().bytes == 157
    delta = led.since(mark)
    assert delta.get("inter", "grad_sync").bytes == 50 and delta.get("intra", "halo").bytes == 7
    again = CommLedger.from_dict(led.to_dict())
    assert again.to_dict() == led.to_dict()
    merged = CommLedger.merged([led, again])
    assert merged.get("intra", "halo").bytes == 14
    assert led.metrics()["comm/inter/grad_sync/bytes"] == 150.0
