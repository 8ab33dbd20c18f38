// SPDX-License-Identifier: MIT
// Forwards the ETH it receives to another address from inside the contract (an internal
// transfer, as exchanges and smart-contract wallets send): the payment watcher tests only.
// Compiled offline with solc-js; Forwarder.json holds its ABI and bytecode.
pragma solidity ^0.8.20;

contract Forwarder {
    function forward(address payable to) external payable {
        (bool ok, ) = to.call{value: msg.value}("");
        require(ok, "forward failed");
    }
}
