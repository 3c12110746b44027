"""Feature fetch plans for MB_base: simulated in one process, every row arrives where it belongs."""

import torch

from lightning_granndis.graph.feature_fetch import fetch_plans


def test_fetch_plans_deliver_the_remote_rows():
    n, P = 100, 3
    x = torch.randn(n, 4)
    owner = torch.randint(0, P, (n,), generator=torch.Generator().manual_seed(0))
    needed = [torch.randperm(n, generator=torch.Generator().manual_seed(r))[:40] for r in range(P)]
    plans = fetch_plans(needed, owner)
    for r, plan in enumerate(plans):
        assert (owner[plan.send_ids] == r).all()  # a rank only serves rows it owns
        batch = x[needed[r]].clone()
        batch[plan.recv_pos] = 0
        received = []
        for q in range(P):  # what the all-to-all delivers from q, in rank order
            start = sum(plans[q].send_splits[:r])
            received.append(x[plans[q].send_ids[start:start + plans[q].send_splits[r]]])
            assert plans[q].send_splits[r] == plan.recv_splits[q]
        batch[plan.recv_pos] = torch.cat(received)
        assert torch.equal(batch, x[needed[r]])
        assert plan.recv_pos.numel() == int((owner[needed[r]] != r).sum())
