"""StageLink: how one rank's pipeline stage talks to its neighbours.

Every control message `(method, argument)` starts at rank 0. The first stage's ranks get
it by broadcast over their tensor-parallel group; each later stage's rank gets it from the
rank with its tensor-parallel index in the stage before, and each rank passes it on to the
next stage before acting on it. A step's hidden states and residual follow the same path
(IntermediateTensors), and the last stage's sampling rank returns the step's output to
rank 0. Every channel is first-in first-out, so micro-batches stay in order on every stage.
"""

import torch
import torch.distributed as dist

from pagedllm.distributed.parallel_state import get_cpu_group, get_pp_group, get_tp_group
from pagedllm.distributed.point_to_point import (
    PendingSends,
    recv_object,
    recv_tensor_dict,
    send_object,
    send_tensor_dict,
)
from pagedllm.models.pipeline import IntermediateTensors

Message = tuple[str, object]


class StageLink:
    def __init__(self, device: torch.device) -> None:
        self.pp, self.tp = get_pp_group(), get_tp_group()
        self.device = device
        self.pending = PendingSends()

    @property
    def samples(self) -> bool:
        """This rank samples the step: tensor-parallel rank 0 of the last stage."""
        return self.pp.is_last_rank and self.tp.is_first_rank

    @property
    def sampling_rank(self) -> int:
        """The global rank that samples (and returns each step's output to rank 0)."""
        return self.pp.ranks[-1] - self.pp.ranks[0]  # ranks[0] is this rank's tp index

    def send_message(self, message: Message) -> None:
        """Rank 0: start a message on its way to every rank."""
        if self.tp.world_size > 1:
            dist.broadcast_object_list([message], src=self.tp.first_rank, group=self.tp.cpu_group)
        self.pass_on(message)

    def receive_message(self) -> Message:
        """Any rank but 0: the next message, passed on to the next stage."""
        if self.pp.is_first_rank:
            box = [None]
            dist.broadcast_object_list(box, src=self.tp.first_rank, group=self.tp.cpu_group)
            message = box[0]
        else:
            message = recv_object(self.pp.prev_rank, self.pp.cpu_group)
        self.pass_on(message)
        return message

    def pass_on(self, message: Message) -> None:
        if not self.pp.is_last_rank:
            send_object(message, self.pp.next_rank, self.pp.cpu_group, self.pending)

    def recv_intermediate(self) -> IntermediateTensors | None:
        """The previous stage's output; None on the first stage."""
        if self.pp.is_first_rank:
            return None
        groups = (self.pp.cpu_group, self.pp.device_group)
        return IntermediateTensors(recv_tensor_dict(self.pp.prev_rank, groups, self.device))

    def send_intermediate(self, intermediate: IntermediateTensors) -> None:
        groups = (self.pp.cpu_group, self.pp.device_group)
        send_tensor_dict(intermediate.tensors, self.pp.next_rank, groups, self.pending)

    def send_output(self, output: object) -> None:
        """The sampling rank: a step's output to rank 0 (unless it is rank 0)."""
        send_object(output, 0, get_cpu_group(), self.pending)

    def recv_output(self) -> object:
        """Rank 0: the oldest step's output from the sampling rank."""
        return recv_object(self.sampling_rank, get_cpu_group(), self.device)

    def max_over_ranks(self, value: int) -> int:
        """The largest `value` of all ranks (every rank calls this)."""
        box = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(box, op=dist.ReduceOp.MAX, group=get_cpu_group())
        return int(box.item())
