"""The HLO intermediate representation: parsing, the graph, the opcode vocabulary, flops."""
