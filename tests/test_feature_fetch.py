"""Feature fetch requests for MB_base: simulated in one process, every row arrives where it belongs."""

import torch

from lightning_granndis.graph.feature_fetch import fetch_request


def test_fetch_requests_deliver_the_remote_rows():
    n, P = 100, 3
    x = torch.randn(n, 4)
    owner = torch.randint(0, P, (n,), generator=torch.Generator().manual_seed(0))
    needed = [torch.randperm(n, generator=torch.Generator().manual_seed(r))[:40] for r in range(P)]
    requests = [fetch_request(needed[r], owner[needed[r]], r, P) for r in range(P)]
    for r, request in enumerate(requests):
        assert request.splits[r] == 0 and request.pos.numel() == int((owner[needed[r]] != r).sum())
        batch = x[needed[r]].clone()
        batch[owner[needed[r]] != r] = 0  # rows owned elsewhere are blank until fetched
        answers = []
        for q, ids in enumerate(request.ids.split(request.splits)):  # what the all-to-alls carry to q and back
            assert (owner[ids] == q).all()  # each id goes to the rank that owns it
            answers.append(x[ids])
        batch[request.pos] = torch.cat(answers)
        assert torch.equal(batch, x[needed[r]])
