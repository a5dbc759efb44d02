"""trustbeam's model: the paper's physics and trust, slot graphs, GNN, BiMamba, baselines.

Layer 2: imports only ``schemas``.

Glossary (paper symbol -> code name):

=================  ==========================================  ==============================
paper              meaning                                     code
=================  ==========================================  ==============================
alpha1, alpha2     weights of p_tr and p_com in T_col           ``TrustWeights.a_tr, a_com``
p_tr, p_com        transmission / computation success           ``tr_success, com_success``
T_col(i, j)        a slot's mean a1*p_tr + a2*p_com, i -> j     ``trust.collaboration_weight``
T_beh              long-term behavioural trust (BM's output)    ``t_beh``
T_res              willingness * comm * comp resources          ``t_res``
T                  T_beh * T_res                                ``trust``
theta              the task's trust threshold                   ``trust_threshold``
gamma              transmission rate W log2(1 + p g / N0)       ``physics.transmission_rate``
W, N0, alpha0      bandwidth, noise power, path-loss exponent   ``SystemParams.bandwidth_hz ...``
g                  channel gain d^-alpha0                       ``physics.channel_gain``
epsilon            energy coefficient (J/(cycle*Hz^2) here)    ``SystemParams.capacitance``
f                  CPU frequency                                ``cpu_hz``
t, E               time and energy (tr, com, tot, local)        ``physics.Cost``
V_time, V_ener     Kano values against local execution          ``physics.kano_value``
xi1, xi2           weights of V_time and V_ener                 ``SystemParams.xi_time, xi_energy``
V                  value of task completion (VoC)               ``physics.value_of_completion``
S                  number of slots in a sequence                ``SlotClock`` sets their bounds
=================  ==========================================  ==============================
"""
