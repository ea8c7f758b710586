"""Converters: a dataset's downloaded source files -> its shipped files, one entry per derivation each
dataset's SOURCE.md describes, named by the dataset's `converter:` in ablate/data/catalog.yaml. An entry
(Converter, registered in CONVERTERS) names a function that takes (inputs: source name -> downloaded path, out:
an empty folder, the catalog entry) and writes every file the manifest lists. A new converter: docs/extending.md,
"A converter".

May import: config, data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from ablate.config.registry import Registry

from ablate.data.converters.articles import convert_craft
from ablate.data.converters.blue import convert_blue_chemprot
from ablate.data.converters.blurb import convert_biosses, convert_gad, convert_hoc, convert_jnlpba
from ablate.data.converters.brat import convert_mantra, convert_quaero, convert_quaero_brat
from ablate.data.converters.coded_documents import convert_fracco, convert_frasimed
from ablate.data.converters.common import convert_copy
from ablate.data.converters.ddi import convert_ddi
from ablate.data.converters.diamed import convert_diamed
from ablate.data.converters.deid import convert_physionet_deid
from ablate.data.converters.e3c_corpus import convert_corpus_en_e3c, convert_corpus_fr_e3c
from ablate.data.converters.leaflets import convert_leaflets
from ablate.data.converters.medquad import convert_medquad
from ablate.data.converters.needle import convert_needle
from ablate.data.converters.others import convert_e3c_fr_ner, convert_morfitt, convert_pubmedqa
from ablate.data.converters.uw_brat import convert_uw_brat


@dataclass(frozen=True)
class Converter:
    """One derivation: `convert(inputs, out, entry)` writes a dataset's files from its downloads."""

    name: str
    convert: Callable

    def __call__(self, inputs, out, entry) -> None:
        self.convert(inputs, out, entry)


def _check_converter(entry: Converter, _registry) -> None:
    if not callable(entry.convert):
        raise TypeError(f"converter {entry.name!r}: convert is not callable")


CONVERTERS: Registry[Converter] = Registry("converter", Converter, _check_converter)
for _converter in (
    Converter("copy", convert_copy),
    Converter("jnlpba", convert_jnlpba),
    Converter("gad", convert_gad),
    Converter("biosses", convert_biosses),
    Converter("hoc", convert_hoc),
    Converter("morfitt", convert_morfitt),
    Converter("pubmedqa_pqal", convert_pubmedqa),
    Converter("e3c_fr_ner", convert_e3c_fr_ner),
    Converter("corpus_en_e3c", convert_corpus_en_e3c),
    Converter("corpus_fr_e3c", convert_corpus_fr_e3c),
    Converter("ddi", convert_ddi),
    Converter("corpus_en_craft", convert_craft),
    Converter("corpus_en_medquad", convert_medquad),
    Converter("corpus_fr_leaflets_e3c", convert_leaflets),
    Converter("quaero", convert_quaero),
    Converter("quaero_brat", convert_quaero_brat),
    Converter("mantragsc_fr", convert_mantra),
    Converter("diamed", convert_diamed),
    Converter("fracco_30", partial(convert_fracco, top_k=30)),
    Converter("fracco_100", partial(convert_fracco, top_k=100)),
    Converter("cantemist", partial(convert_frasimed, subset="cantemist")),
    Converter("distemist", partial(convert_frasimed, subset="distemist")),
    Converter("blue_chemprot", convert_blue_chemprot),
    Converter("uw_brat", convert_uw_brat),
    Converter("physionet_deid", convert_physionet_deid),
    Converter("needle", convert_needle),
):
    CONVERTERS.register(_converter)
