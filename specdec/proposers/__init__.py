from .base import BuildContext, Draft, ProposalContext, Proposer
from .draft_model import DraftModelProposer, check_compatible
from .ngram import NgramProposer
from .registry import build_proposer, build_proposers

__all__ = ["BuildContext", "Draft", "ProposalContext", "Proposer", "DraftModelProposer", "NgramProposer",
           "build_proposer", "build_proposers", "check_compatible"]
